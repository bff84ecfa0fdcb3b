/**
 * A device's held payloads (./payload-store.js) in a folder, for Node: one file per sha256, written
 * to a temporary file and renamed, checked against its digest when read back (a damaged one is
 * dropped and downloaded again). A file's modification time orders the least recently used. Which
 * payload each delta-download slot holds is saved in `slots.json` (the Python store's file).
 */
import { mkdirSync, readdirSync, readFileSync, statSync } from "node:fs";
import { readFile, rename, rm, utimes, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import { enterSlot, evictions, holdsDigest, MAX_SLOTS, type PayloadStore } from "./payload-store.js";

const DIGEST = /^[0-9a-f]{64}$/;
const SLOTS = "slots.json";

/** The slot map saved beside the payloads, read leniently: a damaged file is an empty map. */
function readSlots(folder: string): Map<string, string> {
  try {
    const found: unknown = JSON.parse(readFileSync(join(folder, SLOTS), "utf8"));
    if (typeof found !== "object" || found === null || Array.isArray(found)) return new Map();
    const entries = Object.entries(found).filter(([, v]) => typeof v === "string" && DIGEST.test(v)) as [string, string][];
    return new Map(entries.slice(-MAX_SLOTS));
  } catch {
    return new Map();
  }
}

/**
 * The folder a device's `payload-cache` setting names (edge_sdk/payload_store.py's `payload_folder`):
 * undefined for `off` (or empty); for `auto` (the default), `<root>/<host>-<port>/<device id>`, where root
 * is `$EDGETRAIN_PAYLOAD_CACHE`, else `payloads` in the user's edgetrain cache (`$EDGETRAIN_CACHE`, else
 * `~/.cache/edgetrain`): one folder per server and device, as the Python device names it. On disk, the
 * store costs the device's memory budget nothing but the payload it reads back.
 */
export function payloadFolder(setting: string, server: string, deviceId: string): string | undefined {
  if (setting === "" || setting === "off") return undefined;
  if (setting !== "auto") return setting;
  const url = new URL(server);
  const port = url.port || (url.protocol === "wss:" ? "443" : "80");
  const host = (url.hostname || "server").replace(/^\[|\]$/g, "").replaceAll(":", "_");
  const env = process.env;
  const root = env.EDGETRAIN_PAYLOAD_CACHE || join(env.EDGETRAIN_CACHE || join(homedir(), ".cache", "edgetrain"), "payloads");
  return join(root, `${host}-${port}`, deviceId);
}

export function folderPayloadStore(folder: string, maxBytes: number): PayloadStore {
  mkdirSync(folder, { recursive: true });
  const sizes = new Map<string, number>();
  const found = readdirSync(folder).filter((n) => DIGEST.test(n)).map((n) => ({ n, st: statSync(join(folder, n)) }));
  for (const { n, st } of found.sort((a, b) => a.st.mtimeMs - b.st.mtimeMs)) sizes.set(n, st.size);
  const drop = async (digest: string) => { sizes.delete(digest); await rm(join(folder, digest), { force: true }); };
  const slots = readSlots(folder);
  return {
    fresh: true,
    slot: async (name) => { const d = slots.get(name) ?? ""; return sizes.has(d) ? d : ""; },
    setSlot: async (name, digest) => {
      if (!sizes.has(digest) || !enterSlot(slots, name, digest)) return;
      const tmp = join(folder, `.${SLOTS}.tmp`);
      await writeFile(tmp, JSON.stringify(Object.fromEntries(slots)));
      await rename(tmp, join(folder, SLOTS));
    },
    get: async (digest) => {
      if (!sizes.has(digest)) return undefined;
      let data: Uint8Array;
      try {
        // The file's own buffer, not a copy of it: a copy held a 17 MB chunk twice until V8 collected one.
        const read = await readFile(join(folder, digest));
        data = new Uint8Array(read.buffer, read.byteOffset, read.byteLength);
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
