/**
 * A person's own data, read where it is (a page's file picker: nothing is uploaded): a CSV file of
 * rows, or a folder of images, one subfolder per class. Each gives the device's `x` (float32) and
 * `y` (int64 class indices) and what the hello declares of them (`input_shape`, `num_classes`), so a
 * server whose model takes other data refuses the device, with a message naming both, before any
 * of the model is sent (docs/js-device.md, "A person's own data").
 */
import { tensor } from "./tensors.js";
import type { DeviceData } from "./data.js";

/** Samples, labels and the class names the labels index. */
export interface LabelledData extends DeviceData {
  classes: string[];
}

export interface CsvOptions {
  /** The label's column: a header name or an index; default the column named `label`, else the last. */
  label?: string | number;
}

/** Split one CSV line (RFC 4180 quotes; no line breaks inside a field). */
function fields(line: string): string[] {
  const out: string[] = [];
  let field = "";
  let quoted = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quoted) {
      if (c === '"' && line[i + 1] === '"') { field += '"'; i++; } else if (c === '"') quoted = false; else field += c;
    } else if (c === '"') quoted = true;
    else if (c === ",") { out.push(field); field = ""; } else field += c;
  }
  out.push(field);
  return out.map((f) => f.trim());
}

/**
 * Rows of numbers, one sample per row, and a label column (numbers or names). A first row with a word
 * where the next row has a number is the header. Labels that are integers 0..k-1 are the classes as they are;
 * others (names) are numbered in sorted order.
 */
export function csvData(text: string, options: CsvOptions = {}): LabelledData {
  const lines = text.split(/\r?\n/).filter((l) => l.trim() !== "");
  if (lines.length === 0) throw new Error("the CSV file is empty");
  let rows = lines.map(fields);
  const numeric = (f: string) => f !== "" && Number.isFinite(Number(f));
  // A header: a first row with a word where the next row has a number (a label column may hold words).
  const header = rows[0]!.some((f, i) => !numeric(f) && (rows.length === 1 || numeric(rows[1]![i] ?? ""))) ? rows[0]! : null;
  if (header !== null) rows = rows.slice(1);
  const width = (header ?? rows[0]!).length;
  if (width < 2) throw new Error("a CSV sample needs at least one feature column and a label column");
  const labelAt = typeof options.label === "number" ? options.label
    : header !== null && header.includes(options.label ?? "label") ? header.indexOf(options.label ?? "label")
      : options.label !== undefined ? -1 : width - 1;
  if (labelAt < 0 || labelAt >= width) throw new Error(`the CSV file has no label column ${JSON.stringify(options.label)}`);
  const x = new Float32Array(rows.length * (width - 1));
  const names: string[] = [];
  rows.forEach((row, r) => {
    if (row.length !== width) throw new Error(`CSV row ${r + 1 + (header ? 1 : 0)} has ${row.length} fields, not ${width}`);
    let at = r * (width - 1);
    row.forEach((f, c) => {
      if (c === labelAt) { names.push(f); return; }
      if (!numeric(f)) throw new Error(`CSV row ${r + 1 + (header ? 1 : 0)}, column ${c + 1}: ${JSON.stringify(f.slice(0, 20))} is not a number`);
      x[at++] = Number(f);
    });
  });
  const { y, classes } = labelIndices(names);
  return { x: tensor("float32", [rows.length, width - 1], x), y, classes };
}

/** Labels as int64 class indices: integers 0..k-1 as they are, anything else numbered in sorted order. */
function labelIndices(names: string[]): { y: ReturnType<typeof tensor>; classes: string[] } {
  const integers = names.every((n) => /^\d+$/.test(n));
  const classes = integers
    ? Array.from({ length: Math.max(...names.map(Number)) + 1 }, (_, i) => String(i))
    : [...new Set(names)].sort();
  const index = new Map(classes.map((c, i) => [c, i]));
  return { y: tensor("int64", [names.length], BigInt64Array.from(names, (n) => BigInt(index.get(n)!))), classes };
}

/** A picked image file and the folder path it came from (`webkitRelativePath`: `root/class/name.png`). */
export interface ImageFile {
  name: string;
  webkitRelativePath: string;
  type: string;
}

/** Decode an image file to its pixels at `width` x `height` (RGBA, row by row); a page passes the browser's. */
export type DecodeImage = (file: ImageFile, width: number, height: number) => Promise<Uint8ClampedArray>;

/** The browser's decoder: `createImageBitmap` resized into an `OffscreenCanvas`. */
export const browserDecode: DecodeImage = async (file, width, height) => {
  const bitmap = await createImageBitmap(file as unknown as Blob, { resizeWidth: width, resizeHeight: height, resizeQuality: "high" });
  const canvas = new OffscreenCanvas(width, height);
  const context = canvas.getContext("2d")!;
  context.drawImage(bitmap, 0, 0);
  bitmap.close();
  return context.getImageData(0, 0, width, height).data;
};

/**
 * A folder of images, one subfolder per class (sorted by name: class 0, 1, ...), each image resized to
 * the model's `inputShape` and scaled to [0, 1]: `[channels, height, width]` (1 channel: grey, 3: RGB),
 * `[height, width]` (grey), or `[n]` (grey, a square side of sqrt(n), flattened).
 */
export async function imageData(files: Iterable<ImageFile>, inputShape: number[],
  decode: DecodeImage = browserDecode): Promise<LabelledData> {
  const { channels, height, width } = imageLayout(inputShape);
  const images = [...files].filter((f) => f.type.startsWith("image/") && f.webkitRelativePath.split("/").length >= 3);
  if (images.length === 0) throw new Error("the folder holds no images in class subfolders (folder/class/image.png)");
  const classOf = (f: ImageFile) => f.webkitRelativePath.split("/").at(-2)!;
  const classes = [...new Set(images.map(classOf))].sort();
  const size = channels * height * width;
  const x = new Float32Array(images.length * size);
  const y = new BigInt64Array(images.length);
  for (const [i, file] of images.entries()) {
    const rgba = await decode(file, width, height);
    for (let p = 0; p < height * width; p++) {
      const [r, g, b] = [rgba[4 * p]!, rgba[4 * p + 1]!, rgba[4 * p + 2]!];
      if (channels === 1) x[i * size + p] = (0.299 * r + 0.587 * g + 0.114 * b) / 255;
      else for (let c = 0; c < 3; c++) x[i * size + c * height * width + p] = [r, g, b][c]! / 255;
    }
    y[i] = BigInt(classes.indexOf(classOf(file)));
  }
  return { x: tensor("float32", [images.length, ...inputShape], x), y: tensor("int64", [images.length], y), classes };
}

function imageLayout(shape: number[]): { channels: number; height: number; width: number } {
  if (shape.length === 3 && (shape[0] === 1 || shape[0] === 3)) return { channels: shape[0]!, height: shape[1]!, width: shape[2]! };
  if (shape.length === 2) return { channels: 1, height: shape[0]!, width: shape[1]! };
  const side = Math.round(Math.sqrt(shape[0] ?? 0));
  if (shape.length === 1 && side * side === shape[0]) return { channels: 1, height: side, width: side };
  throw new Error(`images cannot be made into samples of shape [${shape}]`);
}

/** Named vocabularies of the zoo's character models, as the Python device has them
 * (edge_sdk.data.sources.VOCABULARIES): a character's id is its index. */
export const VOCABULARIES: Readonly<Record<string, string>> = Object.freeze({
  tinyshakespeare: "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
});

export interface TextOptions {
  /** The model's characters: a name of `VOCABULARIES` (default `tinyshakespeare`) or the characters themselves. */
  vocabulary?: string;
  /** Characters per sample: the model's input length (default 40). */
  context?: number;
  /** A sample starts every `stride` characters (default 8). */
  stride?: number;
}

/** The distinct characters of `text`, sorted by code point: a vocabulary read from a file of them. */
export function vocabularyOf(text: string): string {
  return [...new Set(Array.from(text))].sort((a, b) => a.codePointAt(0)! - b.codePointAt(0)!).join("");
}

/**
 * A person's own text (a UTF-8 file's contents) as next-character samples, as the Python device reads a
 * `.txt` file (edge_sdk.data.sources.TextSource): windows of `context` character ids every `stride`
 * characters, each labelled with the id of the character after it. Characters outside the vocabulary
 * are left out and counted (`skipped`); `classes` is the vocabulary.
 */
export function textData(text: string, options: TextOptions = {}): LabelledData & { skipped: number } {
  const name = options.vocabulary ?? "tinyshakespeare";
  const chars = Array.from(VOCABULARIES[name] ?? name);
  const context = options.context ?? 40, stride = options.stride ?? 8;
  if (!(context >= 1 && stride >= 1 && chars.length > 0)) throw new Error("context and stride must be positive, and the vocabulary not empty");
  const index = new Map(chars.map((c, i) => [c, i]));
  const ids: number[] = [];
  let seen = 0;
  for (const c of text) {
    seen++;
    const id = index.get(c);
    if (id !== undefined) ids.push(id);
  }
  if (ids.length <= context) {
    throw new Error(`the text has ${ids.length} characters of the model's vocabulary, fewer than one sample of ${context} and the character after it`);
  }
  const count = Math.ceil((ids.length - context) / stride);
  const x = new BigInt64Array(count * context), y = new BigInt64Array(count);
  for (let s = 0; s < count; s++) {
    const start = s * stride;
    for (let t = 0; t < context; t++) x[s * context + t] = BigInt(ids[start + t]!);
    y[s] = BigInt(ids[start + context]!);
  }
  return { x: tensor("int64", [count, context], x), y: tensor("int64", [count], y), classes: chars, skipped: seen - ids.length };
}
