/**
 * A report whose update the server has not acknowledged yet, kept where the device finds it after
 * it was closed: a tab closed mid-upload and opened again, or a Node device restarted, says hello
 * with that round (`resume_round`) and the server asks for the rest of the upload (`resume`,
 * docs/protocol.md "Resume"). Without a store a device resumes only within one run.
 * Node keeps it in a file (`fileStore` in ./pending-file.js), a page in IndexedDB (`indexedDbStore`).
 */
import type { Report } from "./messages.js";

export interface PendingUpload {
  round: number;
  report: Report;
  /** The update's bytes (its tensors, as sent); null for a report without tensors. */
  payload: Uint8Array | null;
}

export interface PendingStore {
  load(): Promise<PendingUpload | null>;
  save(pending: PendingUpload): Promise<void>;
  clear(): Promise<void>;
}

/** Is `value` a pending upload as `save` wrote it (anything else in storage is ignored)? */
export function isPendingUpload(value: unknown): value is PendingUpload {
  const v = value as PendingUpload | null;
  return typeof v === "object" && v !== null && Number.isInteger(v.round) && typeof v.report === "object"
    && v.report !== null && v.report.t === "report" && v.report.round === v.round
    && (v.payload === null || v.payload instanceof Uint8Array);
}

/** The pending upload of `deviceId` in the page's IndexedDB (database `edgetrain-device`), for browsers. */
export function indexedDbStore(deviceId: string, factory: IDBFactory = globalThis.indexedDB): PendingStore {
  const open = (): Promise<IDBDatabase> => new Promise((resolve, reject) => {
    const req = factory.open("edgetrain-device", 1);
    req.onupgradeneeded = () => req.result.createObjectStore("pending");
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
  const run = async <T>(mode: IDBTransactionMode, op: (s: IDBObjectStore) => IDBRequest<T>): Promise<T> => {
    const db = await open();
    try {
      return await new Promise<T>((resolve, reject) => {
        const tx = db.transaction("pending", mode);
        const req = op(tx.objectStore("pending"));
        tx.oncomplete = () => resolve(req.result);
        tx.onerror = () => reject(tx.error);
        tx.onabort = () => reject(tx.error);
      });
    } finally {
      db.close();
    }
  };
  return {
    load: async () => {
      const value: unknown = await run("readonly", (s) => s.get(deviceId));
      return isPendingUpload(value) ? value : null;
    },
    save: async (pending) => { await run("readwrite", (s) => s.put(pending, deviceId)); },
    clear: async () => { await run("readwrite", (s) => s.delete(deviceId)); },
  };
}
