/**
 * The command line's `data`: a file of the device's samples, read as the Python device reads its
 * tables (edge_sdk.data.sources.TabularSource): `.npz` (arrays `x` and `y`) and `.json` (src/shard.ts),
 * or a `.csv`/`.npy` table whose `label-column` (an index, negative from the end, or a CSV header
 * name; default the last) holds the labels and whose other columns are the features, or a UTF-8
 * `.txt` file of the device's own text (next-character samples, edge_sdk.data.sources.TextSource). Whole,
 * non-negative labels are classes (int64); others a regression target (float32). A problem is a
 * `UsageError` naming `--data` (the command exits with 2). Node only.
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import type { DeviceData } from "./data.js";
import { UsageError } from "./errors.js";
import { parseFloatText, pyRepr } from "./pyformat.js";
import { loadShard, parseNpy } from "./shard.js";
import { VOCABULARIES, textData, vocabularyOf } from "./local-data.js";
import { tensor } from "./tensors.js";

/** The files this device trains on, by suffix. */
export const DATA_SUFFIXES = [".npz", ".json", ".csv", ".npy", ".txt"] as const;

/** How a `.txt` file becomes samples: the settings `vocabulary` (a name or a file of the characters), `text-context`, `text-stride`. */
export interface TextSettings { vocabulary: string; context: number; stride: number }

/** A table: its rows of numbers and, for a CSV file with one, its header's column names. */
interface Table { rows: number[][]; header: string[] | null }

/** The samples of the file `path`, its labels in `labelColumn` for a table. */
export function readLocalData(path: string, labelColumn = "-1", text?: TextSettings): DeviceData {
  const suffix = DATA_SUFFIXES.find((s) => path.toLowerCase().endsWith(s));
  if (suffix === undefined || (existsSync(path) && statSync(path).isDirectory())) {
    throw new UsageError(`--data: ${pyRepr(path)} is not a ${DATA_SUFFIXES.join("/")} file (this device trains on a file; `
      + "a folder of images, package.module:function and the research datasets are the Python device's)");
  }
  if (!existsSync(path)) throw new UsageError(`--data: no data file at ${path}`);
  try {
    if (suffix === ".npz" || suffix === ".json") return loadShard(path);
    if (suffix === ".txt") return readText(path, text ?? { vocabulary: "tinyshakespeare", context: 40, stride: 8 });
    const table = suffix === ".csv" ? readCsv(path) : readNpyTable(path);
    return splitLabel(table.rows, labelIndex(labelColumn, table, path));
  } catch (exc) {
    if (exc instanceof UsageError) throw exc;
    throw new UsageError(`--data: ${path}: ${(exc as Error).message}`);
  }
}

/** A UTF-8 text file as next-character samples in the model's vocabulary (local-data.ts, `textData`). */
function readText(path: string, t: TextSettings): DeviceData {
  const vocabulary = t.vocabulary in VOCABULARIES ? t.vocabulary
    : existsSync(t.vocabulary) ? vocabularyOf(readFileSync(t.vocabulary, "utf8")) : null;
  if (vocabulary === null) {
    throw new UsageError(`--vocabulary: ${pyRepr(t.vocabulary)} is neither a named one (${Object.keys(VOCABULARIES).join(", ")}) nor a file`);
  }
  const bytes = readFileSync(path);
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new UsageError(`--data: ${path} is not UTF-8 text`);
  }
  return textData(text, { vocabulary, context: t.context, stride: t.stride });
}

/** A CSV table: a first row that is not all numbers is its header; every other cell must be a number. */
function readCsv(path: string): Table {
  const lines = readFileSync(path, "utf8").split(/\r?\n/);
  const first = lines.findIndex((l) => l.trim() !== "");
  if (first < 0) throw new UsageError(`--data: ${path} is empty`);
  const cells = lines[first]!.split(",").map((c) => c.trim().replace(/^"(.*)"$/, "$1"));
  const header = cells.every((c) => parseFloatText(c) !== null) ? null : cells;
  const rows: number[][] = [];
  lines.slice(header === null ? first : first + 1).forEach((raw, i) => {
    const line = raw.split("#")[0]!;
    if (line.trim() === "") return;
    const row = line.split(",").map((cell, column) => {
      const value = parseFloatText(cell);
      if (value === null) throw new UsageError(`--data: ${path}: every cell but the header must be a number (line ${first + i + (header ? 2 : 1)}, column ${column + 1}: ${pyRepr(cell.trim())})`);
      return value;
    });
    if (rows.length > 0 && row.length !== rows[0]!.length) {
      throw new UsageError(`--data: ${path}: line ${first + i + (header ? 2 : 1)} has ${row.length} columns, the first row ${rows[0]!.length}`);
    }
    rows.push(row);
  });
  if (rows.length === 0) throw new UsageError(`--data: ${path} holds no samples`);
  return { rows, header };
}

/** A 2-D `.npy` array as a table. */
function readNpyTable(path: string): Table {
  const array = parseNpy(new Uint8Array(readFileSync(path)));
  if (array.shape.length !== 2) {
    throw new UsageError(`--data: ${path}: a .npy table is 2-D (rows, columns), got shape (${array.shape.join(", ")}${array.shape.length === 1 ? "," : ""})`);
  }
  const [n, columns] = array.shape as [number, number];
  const values = Array.from(array.data as ArrayLike<number | bigint>, Number);
  return { rows: Array.from({ length: n }, (_, r) => values.slice(r * columns, (r + 1) * columns)), header: null };
}

/** The label column's index from an index (negative counts from the end) or a header name. */
function labelIndex(label: string, table: Table, path: string): number {
  const columns = table.rows[0]!.length;
  if (!/^-?\d+$/.test(label)) {
    if (table.header === null || !table.header.includes(label)) {
      throw new UsageError(`--data: ${path} has no column named ${pyRepr(label)}`
        + (table.header ? ` (columns: ${table.header.join(", ")})` : " (it has no header row)"));
    }
    return table.header.indexOf(label);
  }
  const index = Number(label);
  if (index < -columns || index >= columns || columns < 2) {
    throw new UsageError(`--data: ${path}: label column ${index} outside its ${columns} columns`);
  }
  return (index + columns) % columns;
}

/** Features (float32) and labels (int64 if every label is whole and non-negative, else float32). */
function splitLabel(rows: number[][], column: number): DeviceData {
  const labels = rows.map((r) => r[column]!);
  const features = rows.flatMap((r) => r.filter((_, c) => c !== column));
  const whole = labels.every((v) => Number.isInteger(v) && v >= 0);
  return {
    x: tensor("float32", [rows.length, rows[0]!.length - 1], Float32Array.from(features)),
    y: whole ? tensor("int64", [rows.length], BigInt64Array.from(labels, BigInt))
      : tensor("float32", [rows.length], Float32Array.from(labels)),
  };
}
