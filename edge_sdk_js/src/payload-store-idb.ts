/**
 * Payloads kept in the browser's IndexedDB (docs/protocol.md, "Held payloads"), so that a device page
 * that is closed and opened again downloads none of the chunks, graphs and tails it already holds, as
 * `folderPayloadStore` does for Node across restarts. One database per store name, two object stores:
 * `payloads` (digest -> bytes, size and when last used) and `slots` (delta-download slot -> digest).
 * The least recently used payloads go first once the store is over its byte budget; a payload whose
 * bytes no longer hash to its digest (storage damaged) is dropped and reads as not held. Only `get`
 * brings a payload's bytes into memory: the budget here is storage, not the device's memory budget.
 */
import { openDB, type DBSchema, type IDBPDatabase } from "idb";
import { MAX_SLOTS, evictions, holdsDigest, type PayloadStore } from "./payload-store.js";

/** The database's version; a different one is a schema the store upgrades to. */
const VERSION = 1;

interface Held {
  data: Uint8Array;
  size: number;
  /** Increasing use counter (not a clock: two uses in the same millisecond still order). */
  used: number;
}

interface Schema extends DBSchema {
  payloads: { key: string; value: Held; indexes: { used: number } };
  slots: { key: string; value: { digest: string; set: number } };
}

/** A payload store in the page's IndexedDB database `name`, holding at most `maxBytes`. */
export async function indexedDbPayloadStore(name: string, maxBytes: number): Promise<PayloadStore> {
  if (!(maxBytes >= 0)) throw new RangeError(`an IndexedDB payload store needs a byte budget >= 0, got ${maxBytes}`);
  if ((globalThis as { indexedDB?: IDBFactory }).indexedDB === undefined) {
    throw new Error("this platform has no IndexedDB: use memoryPayloadStore or folderPayloadStore");
  }
  const db: IDBPDatabase<Schema> = await openDB<Schema>(name, VERSION, {
    upgrade(upgrading) {
      upgrading.createObjectStore("payloads").createIndex("used", "used");
      upgrading.createObjectStore("slots");
    },
  });
  // The use counter continues from what the database holds (the newest use of the last visit).
  const newest = await db.transaction("payloads").store.index("used").openCursor(null, "prev");
  let clock = Math.max(newest?.value.used ?? 0, ...(await db.getAll("slots")).map((s) => s.set));

  async function sizes(): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    let cursor = await db.transaction("payloads").store.index("used").openCursor(); // least recently used first
    while (cursor) {
      out.set(cursor.primaryKey, cursor.value.size);
      cursor = await cursor.continue();
    }
    return out;
  }

  return {
    fresh: true,
    async get(digest) {
      const held = await db.get("payloads", digest);
      if (held === undefined) return undefined;
      const data = held.data; // a copy already: what IndexedDB reads is cloned out of its storage
      if (!holdsDigest(data, digest)) {
        await db.delete("payloads", digest);
        return undefined;
      }
      await db.put("payloads", { ...held, used: ++clock }, digest);
      return data;
    },
    async put(digest, data) {
      if (data.byteLength > maxBytes || (await db.getKey("payloads", digest)) !== undefined) return;
      const drop = evictions(await sizes(), data.byteLength, maxBytes);
      const tx = db.transaction("payloads", "readwrite");
      // IndexedDB clones a view's whole buffer: a view of part of one is cut to its own bytes first.
      const own = data.byteOffset === 0 && data.byteLength === data.buffer.byteLength ? data : data.slice();
      await Promise.all([...drop.map((d) => tx.store.delete(d)),
        tx.store.put({ data: own, size: data.byteLength, used: ++clock }, digest), tx.done]);
    },
    async slot(slot) {
      const kept = await db.get("slots", slot);
      if (kept === undefined) return "";
      return (await db.getKey("payloads", kept.digest)) !== undefined ? kept.digest : "";
    },
    async setSlot(slot, digest) {
      if ((await db.getKey("payloads", digest)) === undefined) return;
      const tx = db.transaction("slots", "readwrite");
      await tx.store.put({ digest, set: ++clock }, slot);
      const count = await tx.store.count();
      if (count > MAX_SLOTS) { // the oldest slots go first, as in the other stores
        const all = await tx.store.getAll();
        const keys = await tx.store.getAllKeys();
        const oldest = keys.map((k, i) => [k, all[i]!.set] as const).sort((a, b) => a[1] - b[1]).slice(0, count - MAX_SLOTS);
        await Promise.all(oldest.map(([k]) => tx.store.delete(k)));
      }
      await tx.done;
    },
  };
}
