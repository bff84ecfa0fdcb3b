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

/** The float64 vector of each block [split, L) of `tensors` (float entries only; dense). */
export function blockVectors(tensors: Record<string, TensorValue>, blockNames: readonly string[], split: number): Float64Array[] {
  const floats = new Map<string, Float32Array | Float64Array>();
  for (const [name, value] of Object.entries(tensors)) {
    if ("rowSparse" in value) throw new SecAggError(`entry ${JSON.stringify(name.slice(0, 80))} is row-sparse: a secure round sums dense blocks`);
    if (value.dtype === "float16") throw new SecAggError(`entry ${JSON.stringify(name.slice(0, 80))} is float16: a secure round masks float32 or float64`);
    if (value.data instanceof Float32Array || value.data instanceof Float64Array) floats.set(name, value.data);
  }
  return [...blockEntries([...floats.keys()], blockNames, split).values()].map((names) => {
    const out = new Float64Array(names.reduce((n, name) => n + floats.get(name)!.length, 0));
    let at = 0;
    for (const name of names) {
      out.set(floats.get(name)!, at);
      at += floats.get(name)!.length;
    }
    return out;
  });
}
