/**
 * The multi-step forward pass over frozen ONNX chunks (EmbracingFL Algorithm 1): each chunk is
 * opened, run over the current activations in batches, and released before the next one is
 * fetched; only the activations at the split are kept (cached for the round).
 */
import { closeSession, nextTask, openSession, type Runtime } from "./runtime.js";
import { numel, tensor, type Tensor } from "./tensors.js";

/** Run one chunk (an ONNX model with a dynamic batch axis) over `x` in batches of `batch`; `chunk` may be
 * a function that downloads it, so its bytes go once the session exists (src/runtime.ts, `openSession`). */
export async function runChunk(runtime: Runtime, chunk: Uint8Array | (() => Promise<Uint8Array>), x: Tensor, batch: number,
  threads = 1): Promise<Tensor> {
  const session = await openSession(runtime, chunk, threads);
  try {
    const input = session.inputNames[0]!;
    const output = session.outputNames[0]!;
    const n = x.shape[0]!;
    const row = numel(x.shape.slice(1));
    let result: Float32Array | null = null;
    let shape: number[] = [];
    for (let start = 0; start < n; start += batch) {
      const stop = Math.min(n, start + batch);
      const data = (x.data as Float32Array).subarray(start * row, stop * row);
      const feed = new runtime.ort.Tensor(x.dtype as "float32", data, [stop - start, ...x.shape.slice(1)]);
      const out = await session.run({ [input]: feed });
      const y = out[output]!;
      if (result === null) {
        shape = [n, ...y.dims.slice(1)];
        result = new Float32Array(numel(shape));
      }
      result.set(y.data as Float32Array, start * numel(shape.slice(1)));
      for (const t of Object.values(out)) t.dispose();
      await nextTask();
    }
    return tensor("float32", shape, result ?? new Float32Array(0));
  } finally {
    await closeSession(runtime, session);
  }
}

/** Run the chunks in order over `x`; `chunks` may fetch each one only when asked (one held at a time). */
export async function multiStepForward(runtime: Runtime, chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  x: Tensor, batch: number, threads = 1): Promise<Tensor> {
  let acts = x;
  for await (const chunk of chunks) acts = await runChunk(runtime, chunk, acts, batch, threads);
  return acts;
}
