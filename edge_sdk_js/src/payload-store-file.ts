/**
 * A device's held payloads (./payload-store.js) in a folder, for Node: one file per sha256, written
 * to a temporary file and renamed, checked against its digest when read back (a damaged one is
 * dropped and downloaded again). A file's modification time orders the least recently used.
 */
import { mkdirSync, readdirSync, statSync } from "node:fs";
import { readFile, rename, rm, utimes, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { evictions, holdsDigest, type PayloadStore } from "./payload-store.js";

const DIGEST = /^[0-9a-f]{64}$/;

export function folderPayloadStore(folder: string, maxBytes: number): PayloadStore {
  mkdirSync(folder, { recursive: true });
  const sizes = new Map<string, number>();
  const found = readdirSync(folder).filter((n) => DIGEST.test(n)).map((n) => ({ n, st: statSync(join(folder, n)) }));
  for (const { n, st } of found.sort((a, b) => a.st.mtimeMs - b.st.mtimeMs)) sizes.set(n, st.size);
  const drop = async (digest: string) => { sizes.delete(digest); await rm(join(folder, digest), { force: true }); };
  return {
    get: async (digest) => {
      if (!sizes.has(digest)) return undefined;
      let data: Uint8Array;
      try {
        data = new Uint8Array(await readFile(join(folder, digest)));
      } catch {
        await drop(digest);
        return undefined;
      }
      if (!holdsDigest(data, digest)) { await drop(digest); return undefined; }
      sizes.delete(digest);
      sizes.set(digest, data.byteLength);
      const now = new Date();
      await utimes(join(folder, digest), now, now);
      return data;
    },
    put: async (digest, data) => {
      if (!DIGEST.test(digest) || data.byteLength > maxBytes || sizes.has(digest)) return;
      for (const d of evictions(sizes, data.byteLength, maxBytes)) await drop(d);
      const tmp = join(folder, `.${digest}.tmp`);
      await writeFile(tmp, data);
      await rename(tmp, join(folder, digest));
      sizes.set(digest, data.byteLength);
    },
  };
}
