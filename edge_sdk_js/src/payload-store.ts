/**
 * The payloads a device keeps by sha256, so that none is downloaded twice (docs/protocol.md, "Held
 * payloads"; the Python twin is edge_sdk/payload_store.py). An instruction names each payload's
 * digest; a payload the store holds is fetched with `Fetch.held` and the server sends none of its
 * bytes. `memoryPayloadStore` keeps them for the life of the page or process; `folderPayloadStore`
 * (./payload-store-file.js) keeps them in a folder across restarts, for Node; `indexedDbPayloadStore`
 * (./payload-store-idb.js) in a page's IndexedDB across visits. Each drops the least recently used
 * first once over its byte budget.
 *
 * Each also keeps which payload a device holds for each delta-download slot (docs/protocol.md, "Delta
 * downloads"): the folder store in `slots.json` beside the payloads, so a restarted Node device names
 * its base as the Python device does, the IndexedDB store in its `slots` object store; a slot whose
 * payload is no longer held names nothing.
 */
import { sha256 } from "@noble/hashes/sha2.js";
import { bytesToHex } from "@noble/hashes/utils.js";

export interface PayloadStore {
  /** The held bytes of `digest`, checked against it; undefined if not held (or damaged). */
  get(digest: string): Promise<Uint8Array | undefined>;
  /** Whether `get` reads the bytes afresh each time (a file, IndexedDB), so that the caller owns what it
   * returns and may write over it: a delta download is then rebuilt in its base's bytes, one payload
   * held instead of two (src/downloads.ts). A store that hands out the bytes it keeps says false. */
  readonly fresh?: boolean;
  /** Keep `data`, whose sha256 the caller verified is `digest`. */
  put(digest: string, data: Uint8Array): Promise<void>;
  /** The digest of the payload held for delta-download slot `name` ("" if none, or no longer held). */
  slot(name: string): Promise<string>;
  /** Slot `name` now holds payload `digest` (which the store keeps). */
  setSlot(name: string, digest: string): Promise<void>;
}

/** The most slots kept (the Python store's MAX_SLOTS): a model has a few chunks and a tail per split. */
export const MAX_SLOTS = 256;

/** `slots` with `name` set to `digest` (last), the oldest dropped beyond MAX_SLOTS; whether it changed. */
export function enterSlot(slots: Map<string, string>, name: string, digest: string): boolean {
  if (slots.get(name) === digest) return false;
  slots.delete(name);
  slots.set(name, digest);
  while (slots.size > MAX_SLOTS) slots.delete(slots.keys().next().value as string);
  return true;
}

/** Whether `data` hashes to `digest`. */
export function holdsDigest(data: Uint8Array, digest: string): boolean {
  return bytesToHex(sha256(data)) === digest;
}

/** Least recently used first: which digests to drop for `incoming` more bytes within `maxBytes`. */
export function evictions(sizes: Map<string, number>, incoming: number, maxBytes: number): string[] {
  let total = [...sizes.values()].reduce((a, b) => a + b, 0);
  const out: string[] = [];
  for (const [digest, size] of sizes) {
    if (total + incoming <= maxBytes) break;
    out.push(digest);
    total -= size;
  }
  return out;
}

/** Payloads held in memory, at most `maxBytes` of them. */
export function memoryPayloadStore(maxBytes: number): PayloadStore {
  const held = new Map<string, Uint8Array>();
  const sizes = new Map<string, number>();
  const slots = new Map<string, string>();
  return {
    slot: async (name) => { const d = slots.get(name) ?? ""; return held.has(d) ? d : ""; },
    setSlot: async (name, digest) => { if (held.has(digest)) enterSlot(slots, name, digest); },
    get: async (digest) => {
      const data = held.get(digest);
      if (data === undefined) return undefined;
      sizes.delete(digest);
      sizes.set(digest, data.byteLength); // most recently used
      return data;
    },
    put: async (digest, data) => {
      if (data.byteLength > maxBytes || held.has(digest)) return;
      for (const d of evictions(sizes, data.byteLength, maxBytes)) { sizes.delete(d); held.delete(d); }
      held.set(digest, data.slice());
      sizes.set(digest, data.byteLength);
    },
  };
}
