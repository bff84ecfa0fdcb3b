/**
 * Domain separation, as edge_sdk/secagg/labels.py: every derivation, signature and associated
 * data of secure aggregation is `label(purpose, ...fields)`:
 *
 *   "edgetrain/secagg/v1" 0x00 purpose 0x00 (u16be(len(field)) field)*
 *
 * A text field is its UTF-8, an integer field 8 bytes big-endian (0 <= value < 2^53), a bytes
 * field itself. Pairs are ordered by the UTF-8 bytes of their ids (`ordered`).
 */

export const PREFIX = new TextEncoder().encode("edgetrain/secagg/v1");
export const MAX_INT = 2 ** 53;
const MAX_FIELD_BYTES = 0xffff;

/** A secure-aggregation value that does not hold (size, signature, share, parameters). */
export class SecAggError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SecAggError";
  }
}

/** What a round's keys, masks and shares are bound to: the server's session and the round. */
export interface Scope {
  readonly session: string;
  readonly round: number;
}

const utf8 = new TextEncoder();

/** A checked `Scope`. */
export function scope(session: string, round: number): Scope {
  if (!Number.isInteger(round) || round < 0 || round >= MAX_INT) {
    throw new SecAggError(`round must be an integer in [0, 2**53), got ${round}`);
  }
  if (typeof session !== "string") throw new SecAggError("session must be text");
  if (utf8.encode(session).length > MAX_FIELD_BYTES) throw new SecAggError("session is longer than 65535 bytes");
  return { session, round };
}

export type LabelField = string | number | Uint8Array;

function fieldBytes(value: LabelField): Uint8Array {
  if (typeof value === "number") {
    if (!Number.isInteger(value) || value < 0 || value >= MAX_INT) {
      throw new SecAggError(`integer label field ${value} is outside [0, 2**53)`);
    }
    const out = new Uint8Array(8);
    const view = new DataView(out.buffer);
    view.setUint32(0, Math.floor(value / 2 ** 32));
    view.setUint32(4, value >>> 0);
    return out;
  }
  return typeof value === "string" ? utf8.encode(value) : value;
}

/** The bytes of `purpose` with `fields` in the layout above. */
export function label(purpose: string, ...fields: LabelField[]): Uint8Array {
  const parts: Uint8Array[] = [PREFIX, Uint8Array.of(0), utf8.encode(purpose), Uint8Array.of(0)];
  for (const field of fields) {
    const data = fieldBytes(field);
    if (data.length > MAX_FIELD_BYTES) throw new SecAggError("a label field is longer than 65535 bytes");
    parts.push(Uint8Array.of(data.length >> 8, data.length & 0xff), data);
  }
  return concat(parts);
}

export function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}

/** Negative, zero or positive as `a` sorts before, with or after `b` by UTF-8 bytes. */
export function compareIds(a: string, b: string): number {
  const x = utf8.encode(a);
  const y = utf8.encode(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    if (x[i] !== y[i]) return x[i]! - y[i]!;
  }
  return x.length - y.length;
}

/** The two ids lowest first, by their UTF-8 bytes. */
export function ordered(a: string, b: string): [string, string] {
  if (a === b) throw new SecAggError(`a pair needs two different devices, got ${JSON.stringify(a)} twice`);
  return compareIds(a, b) < 0 ? [a, b] : [b, a];
}

/** `value` itself, refused unless it is a Uint8Array of exactly `size` bytes. */
export function checkBytes(name: string, value: unknown, size: number): Uint8Array {
  if (!(value instanceof Uint8Array)) throw new SecAggError(`${name} must be bytes`);
  if (value.length !== size) throw new SecAggError(`${name} must be ${size} bytes, got ${value.length}`);
  return value;
}
