/**
 * Which coordinates make up a block's vector, as edge_sdk/secagg/layout.py: the concatenation,
 * flattened, of the float entries of that block in the order of their names' UTF-8 bytes; an entry
 * belongs to the block its name's second component names (`blocks.<block>.<rest>`). The
 * instruction of a secure round names the blocks in order (`secagg_blocks`, comma-separated), so a
 * device needs no model to find them.
 */
import type { TensorValue } from "../tensors.js";
import { SecAggError, compareIds } from "./labels.js";

/** Block index -> its entries' names in vector order, for blocks [split, L); every name must belong to one. */
export function blockEntries(names: readonly string[], blockNames: readonly string[], split: number): Map<number, string[]> {
  const index = new Map(blockNames.map((b, i) => [b, i]));
  const out = new Map<number, string[]>();
  for (let i = split; i < blockNames.length; i++) out.set(i, []);
  for (const name of names) {
    const parts = name.split(".");
    const block = parts.length > 2 && parts[0] === "blocks" ? index.get(parts[1]!) : undefined;
    if (block === undefined || block < split) {
      throw new SecAggError(`entry ${JSON.stringify(name.slice(0, 80))} is in none of the blocks [${split}, ${blockNames.length})`);
    }
    out.get(block)!.push(name);
  }
  for (const entries of out.values()) entries.sort(compareIds);
  return out;
}

/** Each block [split, L)'s vector as its float entries' arrays, in vector order: the vector without
 * the copy (a device masks them slice by slice, round.ts). Float entries only; dense. */
export function blockParts(tensors: Record<string, TensorValue>, blockNames: readonly string[], split: number
): (Float32Array | Float64Array)[][] {
  const floats = new Map<string, Float32Array | Float64Array>();
  for (const [name, value] of Object.entries(tensors)) {
    if ("rowSparse" in value) throw new SecAggError(`entry ${JSON.stringify(name.slice(0, 80))} is row-sparse: a secure round sums dense blocks`);
    if (value.dtype === "float16") throw new SecAggError(`entry ${JSON.stringify(name.slice(0, 80))} is float16: a secure round masks float32 or float64`);
    if (value.data instanceof Float32Array || value.data instanceof Float64Array) floats.set(name, value.data);
  }
  return [...blockEntries([...floats.keys()], blockNames, split).values()].map((names) => names.map((name) => floats.get(name)!));
}

/** The float64 vector of each block [split, L) of `tensors` (float entries only; dense). */
export function blockVectors(tensors: Record<string, TensorValue>, blockNames: readonly string[], split: number): Float64Array[] {
  return blockParts(tensors, blockNames, split).map((parts) => {
    const out = new Float64Array(parts.reduce((n, part) => n + part.length, 0));
    let at = 0;
    for (const part of parts) {
      out.set(part, at);
      at += part.length;
    }
    return out;
  });
}
