/**
 * The device's `--config` file: TOML, read with smol-toml as the Python device reads it with
 * tomllib (integers kept apart from floats), its keys those of the shared key table
 * (src/settings.ts). Node only.
 */
import { readFileSync } from "node:fs";
import { parse, TomlError } from "smol-toml";
import { SettingError } from "./errors.js";
import type { ConfigFile } from "./settings.js";

/** Words of the errors a config file's read meets, as Python's `strerror` says them. */
const STRERROR: Record<string, string> = {
  ENOENT: "No such file or directory", EACCES: "Permission denied", EISDIR: "Is a directory", EPERM: "Operation not permitted",
};

/** Why a file could not be read, in Python's `strerror` words where they are known. */
export function strerror(exc: unknown): string {
  const code = (exc as NodeJS.ErrnoException).code ?? "";
  return STRERROR[code] ?? ((exc as Error).message || code);
}

/** The file's keys and values; a `SettingError` for a file that cannot be read (`--config: ...`) or is not TOML. */
export function readConfig(path: string): ConfigFile {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (exc) {
    throw new SettingError("--config", `cannot read ${path}: ${strerror(exc)}`);
  }
  return { path, values: parseConfig(text, path) };
}

/** A config file's text as TOML values (a `bigint` for an integer, a `number` for a float). */
export function parseConfig(text: string, path = "config"): Record<string, unknown> {
  try {
    return { ...parse(text, { integersAsBigInt: true }) };
  } catch (exc) {
    if (!(exc instanceof TomlError)) throw exc;
    const what = exc.message.split("\n")[0]!.replace(/^Invalid TOML document: (.)/, (_, c: string) => c.toUpperCase());
    throw new SettingError(path, `not valid TOML: ${what} (at line ${exc.line}, column ${exc.column})`);
  }
}
