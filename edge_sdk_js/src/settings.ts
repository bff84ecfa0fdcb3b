/**
 * The device's settings, read from the Python device's key table (src/settings-table.ts, generated
 * from edge_sdk/device_settings.json, which edge_sdk/settings.py writes from its one declaration):
 * the same keys, types, defaults, bounds and choices, converted and refused in the Python device's
 * words (edge_sdk/values.py), so one config file means the same to both devices and
 * `--print-settings` prints the same JSON. A key this device does not honour (`sdks`) is read,
 * checked by its type and printed, with a warning naming the key and the device that honours it.
 *
 * Values come as command-line text (strings) or from TOML: a `bigint` is a TOML integer, a
 * `number` a TOML float (smol-toml's `integersAsBigInt`), as Python's tomllib tells `3` from `3.0`.
 * No Node module is imported here: a page may read the defaults too.
 */
import { SettingError } from "./errors.js";
import { SETTINGS_TABLE, type SettingRow } from "./settings-table.js";
import { jsonString, parseFloatText, pyFloat, pyG, pyRepr } from "./pyformat.js";
import { parseSize } from "./units.js";

export type { SettingRow } from "./settings-table.js";
export type SettingValue = string | number | boolean | string[] | null;
/** Resolved settings keyed by the table's keys (`reconnect-retries`). */
export type Settings = Record<string, SettingValue>;

/** `reconnect-retries` that never gives up (the default: a device is a service). */
export const FOREVER = -1;
/** This SDK's name in the table's `sdks`. */
export const THIS_SDK = "javascript";

const TRUE_WORDS = ["true", "1", "yes", "on"];
const FALSE_WORDS = ["false", "0", "no", "off"];
const NONE_WORDS = ["none", ""];

const ROWS: ReadonlyMap<string, SettingRow> = new Map(SETTINGS_TABLE.settings.map((r) => [r.key, r]));

/** Checks a value's type cannot say (edge_sdk/settings.py's `check=`), for the keys that have one here. */
const CHECKS: Record<string, (value: string) => string | null> = {
  server: (url) => /^wss?:\/\/[^/\s]+/i.test(url) ? null
    : `${pyRepr(url)} is not a websocket URL; write ws://HOST:PORT (or wss://HOST:PORT for TLS)`,
  "image-size": (text) => text === "" || /^\d+x\d+$/.test(text) ? null
    : `expected WIDTHxHEIGHT such as 32x32, got ${pyRepr(text)}`,
};

/** The table's rows (those `sdk` honours, or all). */
export function settingRows(sdk?: string): SettingRow[] {
  return SETTINGS_TABLE.settings.filter((r) => sdk === undefined || (r.sdks as string[]).includes(sdk));
}

/** The row of `key` (a config key; `data_root` is `data-root`). */
export function settingRow(key: string): SettingRow | undefined {
  return ROWS.get(key.replaceAll("_", "-"));
}

/** The declared default of `key`. */
export function settingDefault(key: string): SettingValue {
  const value = ROWS.get(key)?.default;
  if (value === undefined) throw new Error(`no setting ${key}`);
  return Array.isArray(value) ? [...value] : value;
}

/** A value that does not convert: `must be ..., got ...`. */
class Refused extends Error {}

/**
 * `value` of setting `key` converted and checked as the table says; a `SettingError` naming
 * `where` (the key by default) otherwise. Strings are parsed (command lines and config files give text).
 */
export function checkSetting(key: string, value: unknown, where = key): SettingValue {
  const row = ROWS.get(key);
  if (row === undefined) throw new SettingError(where, `no such setting ${pyRepr(key)}`);
  try {
    const out = row.default === null ? convertNullable(row, value) : convertValue(row, value);
    const problem = typeof out === "string" ? CHECKS[key]?.(out) : null;
    if (problem) throw new Refused(problem);
    return out;
  } catch (exc) {
    if (exc instanceof Refused) throw new SettingError(where, exc.message);
    throw exc;
  }
}

/** A setting whose default is null (`budget`, `data-limit`): `none` or nothing, else its type; one message for both. */
function convertNullable(row: SettingRow, value: unknown): SettingValue {
  if (value === null || (typeof value === "string" && NONE_WORDS.includes(value.trim().toLowerCase()))) return null;
  try {
    return convertValue(row, value);
  } catch (exc) {
    if (exc instanceof Refused) throw new Refused(`must be ${accepted(row)}, or none, got ${pyRepr(value)}`);
    throw exc;
  }
}

function convertValue(row: SettingRow, value: unknown): SettingValue {
  const refused = () => new Refused(`must be ${accepted(row)}, got ${pyRepr(value)}`);
  const text = typeof value === "string" ? value.trim() : null;
  switch (row.type) {
    case "bool":
      if (typeof value === "boolean") return value;
      if (text !== null && [...TRUE_WORDS, ...FALSE_WORDS].includes(text.toLowerCase())) return TRUE_WORDS.includes(text.toLowerCase());
      throw refused();
    case "int": case "size": {
      let out: number;
      if (typeof value === "bigint") out = Number(value);
      else if (text !== null && row.type === "size") {
        try {
          out = parseSize(value as string);
        } catch (exc) {
          throw new Refused(`must be ${accepted(row)}, got ${pyRepr(value)} (${(exc as Error).message})`);
        }
      } else if (text !== null && /^[+-]?\d+$/.test(text)) out = Number(text);
      else throw refused();
      return inRange(row, out);
    }
    case "float": {
      if (typeof value === "bigint" || typeof value === "number") return inRange(row, Number(value));
      const out = text === null ? null : parseFloatText(text);
      if (out === null) throw refused();
      return inRange(row, out);
    }
    case "list": {
      const items = Array.isArray(value) ? value : [value];
      if (!items.every((i) => typeof i === "string")) throw new Refused(`must be ${accepted(row)}, got ${pyRepr(items)}`);
      return [...items] as string[];
    }
    case "str":
      if (row.choices.length > 0) {
        const choice = row.choices.find((c) => value === c || text === c);
        if (choice === undefined) throw refused();
        return choice;
      }
      if (typeof value === "string") return value;
      if (typeof value === "bigint") return String(value);
      if (typeof value === "number") return pyFloat(value);
      throw refused();
  }
}

/** What a row accepts, in edge_sdk.values.accepted's words. */
function accepted(row: SettingRow): string {
  const words = row.choices.length > 0 ? `one of ${row.choices.join(", ")}` : {
    str: "a string", int: "an integer (a whole number)", float: "a number", bool: "true or false (also 1/0, yes/no, on/off)",
    size: "a size (bytes, or with a unit: 512MiB, 1GiB)", list: "a list of strings (comma-separated in text)",
  }[row.type];
  return row.min === null ? words : `${words} >= ${pyG(row.min)}`;
}

function inRange(row: SettingRow, value: number): number {
  if (row.min !== null && !(value >= row.min)) {
    throw new Refused(`must be >= ${pyG(row.min)}, got ${row.type === "float" ? pyFloat(value) : String(value)}`);
  }
  return value;
}

export interface ConfigFile {
  /** The file as the user named it (errors and warnings name it so). */
  path: string;
  /** Its keys and values as TOML gives them. */
  values: Record<string, unknown>;
}

/**
 * The settings from the command line's values `given` (by key; undefined: not given) over the
 * config file's over the defaults, each converted and checked, as edge_sdk.settings.load_settings
 * does. A key this device does not honour is accepted with a `warn`ing; an unknown key is an error.
 */
export function resolveSettings(given: Record<string, unknown>, file: ConfigFile | null,
  warn: (message: string) => void = (m) => console.error(`warning: ${m}`)): Settings {
  const values: Settings = {};
  const where: Record<string, string> = {};
  for (const [key, value] of Object.entries(file?.values ?? {})) {
    const row = settingRow(key);
    if (row === undefined) throw new SettingError(file!.path, `unknown key ${pyRepr(key)}; known: ${[...ROWS.keys()].sort().join(", ")}`);
    if (!(row.sdks as string[]).includes(THIS_SDK)) {
      warn(`${file!.path}: ${key}: a setting of the ${row.sdks.join(" and ")} device only; this device ignores it`);
    }
    where[row.key] = `${file!.path}: ${key}`;
    values[row.key] = checkSetting(row.key, value, where[row.key]);
  }
  for (const [key, value] of Object.entries(given)) {
    if (value === undefined || value === null || (Array.isArray(value) && value.length === 0)) continue;
    where[key] = `--${key}`;
    values[key] = checkSetting(key, value, where[key]);
  }
  const settings: Settings = Object.fromEntries(SETTINGS_TABLE.settings.map((r) => [r.key, values[r.key] ?? settingDefault(r.key)]));
  if (!String(settings["id"]).trim()) {
    throw new SettingError(where["id"] ?? "--id", 'every device needs an id (--id, or id = "..." in the config file)');
  }
  const idProblem = deviceIdProblem(String(settings["id"]));
  if (idProblem !== null) throw new SettingError(where["id"] ?? "--id", idProblem);
  if (settings["tls-ca"] && !String(settings["server"]).toLowerCase().startsWith("wss://")) {
    throw new SettingError(where["tls-ca"] ?? "--tls-ca", `is for a wss:// server, and ${pyRepr(settings["server"])} is not one`);
  }
  return settings;
}

/**
 * The characters a device id may use (docs/protocol.md, "Device ids"), as edge_sdk.settings.DEVICE_ID_PATTERN:
 * no control or bidi character, no space, no path piece.
 */
export const DEVICE_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$/;

/** Why `id` is not a device id, as edge_sdk.settings.device_id_problem says it; null if it is. */
export function deviceIdProblem(id: string): string | null {
  if (DEVICE_ID_PATTERN.test(id)) return null;
  const shown = pyRepr(id.slice(0, 64)).replace(/[^\x20-\x7e]/gu, (c) => {
    const code = c.codePointAt(0)!;
    return code <= 0xff ? `\\x${code.toString(16).padStart(2, "0")}`
      : code <= 0xffff ? `\\u${code.toString(16).padStart(4, "0")}` : `\\U${code.toString(16).padStart(8, "0")}`;
  });
  return `device id ${shown} is not 1-128 of A-Z a-z 0-9 . _ - : @ + = starting with a letter or digit`;
}

/** The settings as `--print-settings` prints them: the Python device's `json.dumps(..., indent=2)`, byte for byte. */
export function settingsJson(settings: Settings): string {
  const lines = SETTINGS_TABLE.settings.map((r) => `  ${jsonString(r.key)}: ${jsonValue(settings[r.key] ?? null, r.type)}`);
  return `{\n${lines.join(",\n")}\n}`;
}

function jsonValue(value: SettingValue, type: SettingRow["type"]): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return value.length === 0 ? "[]" : `[\n${value.map((v) => `    ${jsonString(v)}`).join(",\n")}\n  ]`;
  if (typeof value === "string") return jsonString(value);
  if (typeof value === "boolean") return String(value);
  if (type !== "float") return String(value);
  return Number.isNaN(value) ? "NaN" : value === Infinity ? "Infinity" : value === -Infinity ? "-Infinity" : pyFloat(value);
}
