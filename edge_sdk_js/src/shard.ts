/**
 * A device's local data from a file, for the Node command line: numpy's `.npz` (arrays `x` and
 * `y`, as `numpy.savez` writes them, stored or deflated) or JSON (`{"x": [[...], ...], "y": [...]}`).
 */
import { readFileSync } from "node:fs";
import { inflateRawSync } from "node:zlib";
import type { DeviceData } from "./data.js";
import { numel, tensor, type DType, type Tensor } from "./tensors.js";

const NPY_DTYPES: Record<string, DType> = { "<f4": "float32", "<f8": "float64", "<i8": "int64", "<i4": "int32", "|u1": "uint8", "|b1": "bool" };

/** One `.npy` array (C order, little-endian, one of the wire dtypes). */
export function parseNpy(bytes: Uint8Array): Tensor {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes[0] !== 0x93 || new TextDecoder().decode(bytes.subarray(1, 6)) !== "NUMPY") throw new Error("not a .npy array");
  const major = bytes[6]!;
  const headerLen = major === 1 ? dv.getUint16(8, true) : dv.getUint32(8, true);
  const start = major === 1 ? 10 : 12;
  const header = new TextDecoder().decode(bytes.subarray(start, start + headerLen));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1] ?? "";
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1] ?? "";
  if (/'fortran_order':\s*True/.test(header)) throw new Error("Fortran-ordered arrays are not supported");
  const dtype = NPY_DTYPES[descr];
  if (dtype === undefined) throw new Error(`unsupported .npy dtype ${descr}`);
  const shape = shapeText.split(",").map((s) => s.trim()).filter((s) => s !== "").map(Number);
  const body = bytes.slice(start + headerLen);
  const count = numel(shape);
  const buf = body.buffer as ArrayBuffer;
  const data = dtype === "float32" ? new Float32Array(buf, 0, count) : dtype === "float64" ? Float32Array.from(new Float64Array(buf, 0, count))
    : dtype === "int64" ? new BigInt64Array(buf, 0, count) : dtype === "int32" ? BigInt64Array.from(new Int32Array(buf, 0, count), BigInt)
      : Float32Array.from(new Uint8Array(buf, 0, count));
  const outType: DType = data instanceof BigInt64Array ? "int64" : "float32";
  return tensor(outType, shape, data);
}

/** The members of a zip archive (as numpy writes .npz files, zip64 included). */
export function readZip(bytes: Uint8Array): Map<string, Uint8Array> {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let eocd = -1;
  for (let i = bytes.length - 22; i >= Math.max(0, bytes.length - 65557); i--) if (dv.getUint32(i, true) === 0x06054b50) { eocd = i; break; }
  if (eocd < 0) throw new Error("not a zip archive");
  let entries = dv.getUint16(eocd + 10, true);
  let cd = dv.getUint32(eocd + 16, true);
  if (cd === 0xffffffff || entries === 0xffff) {
    const locator = eocd - 20;
    const z64 = Number(dv.getBigUint64(locator + 8, true));
    entries = Number(dv.getBigUint64(z64 + 32, true));
    cd = Number(dv.getBigUint64(z64 + 48, true));
  }
  const out = new Map<string, Uint8Array>();
  for (let e = 0, p = cd; e < entries; e++) {
    const method = dv.getUint16(p + 10, true);
    let size = dv.getUint32(p + 20, true);
    const nameLen = dv.getUint16(p + 28, true), extraLen = dv.getUint16(p + 30, true), commentLen = dv.getUint16(p + 32, true);
    let local = dv.getUint32(p + 42, true);
    const name = new TextDecoder().decode(bytes.subarray(p + 46, p + 46 + nameLen));
    let uncompressed = dv.getUint32(p + 24, true);
    for (let x = p + 46 + nameLen; x < p + 46 + nameLen + extraLen;) {
      const id = dv.getUint16(x, true), len = dv.getUint16(x + 2, true);
      if (id === 1) {
        let q = x + 4;
        if (uncompressed === 0xffffffff) { uncompressed = Number(dv.getBigUint64(q, true)); q += 8; }
        if (size === 0xffffffff) { size = Number(dv.getBigUint64(q, true)); q += 8; }
        if (local === 0xffffffff) local = Number(dv.getBigUint64(q, true));
      }
      x += 4 + len;
    }
    const dataStart = local + 30 + dv.getUint16(local + 26, true) + dv.getUint16(local + 28, true);
    const raw = bytes.subarray(dataStart, dataStart + size);
    out.set(name, method === 0 ? raw : new Uint8Array(inflateRawSync(raw)));
    p += 46 + nameLen + extraLen + commentLen;
  }
  return out;
}

function fromJson(obj: { x: unknown; y: unknown }): DeviceData {
  const xs = obj.x as unknown[];
  const shape: number[] = [];
  for (let v: unknown = xs; Array.isArray(v); v = v[0]) shape.push(v.length);
  const flat = (xs as unknown[]).flat(Infinity) as number[];
  const ys = obj.y as number[];
  const integer = ys.every((v) => Number.isInteger(v));
  return {
    x: tensor("float32", shape, Float32Array.from(flat)),
    y: integer ? tensor("int64", [ys.length], BigInt64Array.from(ys, BigInt)) : tensor("float32", [ys.length], Float32Array.from(ys)),
  };
}

/** Load `x` and `y` from a `.npz` or `.json` file. */
export function loadShard(path: string): DeviceData {
  const bytes = new Uint8Array(readFileSync(path));
  if (path.endsWith(".json")) return fromJson(JSON.parse(new TextDecoder().decode(bytes)));
  const members = readZip(bytes);
  const x = members.get("x.npy"), y = members.get("y.npy");
  if (x === undefined || y === undefined) throw new Error(`${path} must hold arrays x and y`);
  return { x: parseNpy(x), y: parseNpy(y) };
}

export { parseSize } from "./units.js";
