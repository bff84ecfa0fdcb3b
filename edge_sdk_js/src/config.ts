/**
 * The device's `--config` file: the TOML a Python device reads (`python -m edge_sdk --config`), with
 * the keys this device knows (each an option without its dashes). Only what such a file holds is
 * parsed: `key = value` lines of strings, numbers, booleans and arrays of strings, and comments.
 */
import { readFileSync } from "node:fs";

export type ConfigValue = string | boolean | string[];

/** The keys a device config file may hold here: the Python device's, and `runtime`. */
export const CONFIG_KEYS = ["server", "id", "budget", "data", "runtime", "token", "secret-file", "threads",
  "device-class", "label", "reconnect-retries", "json-events", "payload-cache", "payload-cache-size"] as const;

/** Parse a config file's text; an unknown key or a line that is not `key = value` is an error naming its line. */
export function parseConfig(text: string, where = "config"): Record<string, ConfigValue> {
  const out: Record<string, ConfigValue> = {};
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = stripComment(raw).trim();
    if (line === "") return;
    const fail = (why: string): never => { throw new Error(`${where}:${i + 1}: ${why}`); };
    const m = /^([A-Za-z0-9_-]+)\s*=\s*(.+)$/.exec(line) ?? fail(`expected key = value, got ${JSON.stringify(raw.trim())}`);
    const key = m[1]!.replaceAll("_", "-");
    if (!(CONFIG_KEYS as readonly string[]).includes(key)) fail(`unknown key ${JSON.stringify(m[1])}; known: ${CONFIG_KEYS.join(", ")}`);
    out[key] = parseValue(m[2]!.trim(), fail);
  });
  return out;
}

export function readConfig(path: string): Record<string, ConfigValue> {
  return parseConfig(readFileSync(path, "utf8"), path);
}

function parseValue(text: string, fail: (why: string) => never): ConfigValue {
  if (text === "true" || text === "false") return text === "true";
  if (/^[+-]?\d[\d_]*(\.\d+)?([eE][+-]?\d+)?$/.test(text)) return text.replaceAll("_", "");
  if (text.startsWith("[")) {
    if (!text.endsWith("]")) fail("an array ends on its own line with ]");
    const items = text.slice(1, -1).trim();
    if (items === "") return [];
    return splitItems(items).map((item) => {
      const value = parseValue(item.trim(), fail);
      return typeof value === "string" ? value : fail("arrays hold strings");
    });
  }
  if (text.length >= 2 && text[0] === '"' && text.at(-1) === '"') {
    try { return JSON.parse(text) as string; } catch { fail(`bad string ${text}`); }
  }
  if (text.length >= 2 && text[0] === "'" && text.at(-1) === "'") return text.slice(1, -1);
  return fail(`a value is a "string", a number, true/false or an array, got ${text}`);
}

/** A line without its comment (a # outside quotes). */
function stripComment(line: string): string {
  const at = outsideQuotes(line, "#")[0];
  return at === undefined ? line : line.slice(0, at);
}

/** Array items split at the commas outside quotes. */
function splitItems(text: string): string[] {
  const items: string[] = [];
  let start = 0;
  for (const at of [...outsideQuotes(text, ","), text.length]) {
    items.push(text.slice(start, at));
    start = at + 1;
  }
  return items.at(-1)!.trim() === "" ? items.slice(0, -1) : items;
}

/** Where `char` occurs in `text` outside "double" (with \ escapes) and 'single' quotes. */
function outsideQuotes(text: string, char: string): number[] {
  const found: number[] = [];
  let quote: string | null = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (quote !== null) {
      if (c === "\\" && quote === '"') i++;
      else if (c === quote) quote = null;
    } else if (c === '"' || c === "'") quote = c;
    else if (c === char) found.push(i);
  }
  return found;
}
