/** A device's local data, as an app hands it over (docs/js-device.md, "A browser page"). */
import type { Tensor } from "./tensors.js";

/** The device's local data: inputs (a leading sample axis) and one label per sample. */
export interface DeviceData {
  x: Tensor;
  y: Tensor;
}

/** Data from the app: tensors, or batches (an iterable or async iterable) gathered once at start. */
export type DataSource = DeviceData | AsyncIterable<DeviceData> | Iterable<DeviceData>;

/** The source's samples as one pair of tensors (batches joined along the sample axis). */
export async function gather(source: DataSource): Promise<DeviceData> {
  if ("x" in source && "y" in source) return source as DeviceData;
  const parts: DeviceData[] = [];
  for await (const part of source as AsyncIterable<DeviceData>) parts.push(part);
  if (parts.length === 0) throw new Error("the data source yielded no batches");
  const join = (ts: Tensor[]): Tensor => {
    const n = ts.reduce((a, t) => a + t.shape[0]!, 0);
    const Ctor = ts[0]!.data.constructor as new (k: number) => Tensor["data"];
    const out = new Ctor(ts.reduce((a, t) => a + t.data.length, 0));
    let at = 0;
    for (const t of ts) { (out as Float32Array).set(t.data as Float32Array, at); at += t.data.length; }
    return { dtype: ts[0]!.dtype, shape: [n, ...ts[0]!.shape.slice(1)], data: out };
  };
  return { x: join(parts.map((p) => p.x)), y: join(parts.map((p) => p.y)) };
}

/**
 * What the hello declares of the data (`Hello.input_shape`, `num_classes`, as the Python device's
 * data sources do): one sample's shape, and for integer labels their count (largest + 1; -1 for a
 * regression target). The server refuses data its model cannot take before sending any of it.
 */
export function declaredData(data: DeviceData): { input_shape: number[]; num_classes: number } {
  let largest = -1;
  if (data.y.dtype === "int64" || data.y.dtype === "int32" || data.y.dtype === "uint8") {
    for (const v of data.y.data as Iterable<number | bigint>) largest = Math.max(largest, Number(v));
  }
  return { input_shape: data.x.shape.slice(1), num_classes: largest < 0 ? -1 : largest + 1 };
}
