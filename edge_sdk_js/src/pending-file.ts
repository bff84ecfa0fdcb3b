/**
 * A device's pending upload (./pending.js) in a file, for Node: written whole to a temporary file
 * and renamed over the old one, so a device killed while writing finds the previous one intact.
 */
import { decode, encode } from "@msgpack/msgpack";
import { readFile, rename, rm, writeFile } from "node:fs/promises";
import { isPendingUpload, type PendingStore } from "./pending.js";

export function fileStore(path: string): PendingStore {
  return {
    load: async () => {
      let bytes: Uint8Array;
      try {
        bytes = await readFile(path);
      } catch {
        return null;
      }
      try {
        const value = decode(bytes);
        return isPendingUpload(value) ? value : null;
      } catch {
        return null; // not ours, or cut short: start afresh
      }
    },
    save: async (pending) => {
      await writeFile(`${path}.tmp`, encode(pending));
      await rename(`${path}.tmp`, path);
    },
    clear: async () => { await rm(path, { force: true }); },
  };
}
