/**
 * A report whose update the server has not acknowledged yet, kept where the device finds it after
 * it was closed: a tab closed mid-upload and opened again, or a Node device restarted, says hello
 * with that round (`resume_round`) and the server asks for the rest of the upload (`resume`,
 * docs/protocol.md "Resume"). Without a store a device resumes only within one run.
 * Node keeps it in a file (`fileStore` in ./pending-file.js), a page in IndexedDB (`indexedDbStore`).
 */
import { openDB, type IDBPDatabase } from "idb";
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
export function indexedDbStore(deviceId: string): PendingStore {
  // Opened for each use and closed after it: a page that opens it again (a reload) is never blocked.
  const run = async <T>(op: (db: IDBPDatabase) => Promise<T>): Promise<T> => {
    const db = await openDB("edgetrain-device", 1, { upgrade: (upgrading) => { upgrading.createObjectStore("pending"); } });
    try {
      return await op(db);
    } finally {
      db.close();
    }
  };
  return {
    load: async () => {
      const value: unknown = await run((db) => db.get("pending", deviceId));
      return isPendingUpload(value) ? value : null;
    },
    save: async (pending) => { await run((db) => db.put("pending", pending, deviceId)); },
    clear: async () => { await run((db) => db.delete("pending", deviceId)); },
  };
}
