// One run of an ONNX graph in a JavaScript runtime, for bench/relu_sides.py:
//
//   node bench/graph-run.mjs <folder> node|web
//
// reads <folder>/graph.onnx and <folder>/feed.bin (tensors, edge_sdk.protocol encoding), runs the
// graph once with the device's session settings and writes every output to <folder>/out-<kind>.bin.
import { readFileSync, writeFileSync } from "node:fs";
import { decodeTensors, encodeTensors, loadRuntime, openSession, tensor } from "../dist/index.js";

const [folder, kind] = process.argv.slice(2);
const runtime = await loadRuntime(kind, 1);
const session = await openSession(runtime, new Uint8Array(readFileSync(`${folder}/graph.onnx`)));
const feed = {};
for (const [name, t] of Object.entries(decodeTensors(new Uint8Array(readFileSync(`${folder}/feed.bin`))))) {
  feed[name] = new runtime.ort.Tensor(t.dtype, t.data, t.shape);
}
const outputs = await session.run(feed);
const result = {};
for (const [name, t] of Object.entries(outputs)) result[name] = tensor(t.type, Array.from(t.dims), t.data);
writeFileSync(`${folder}/out-${kind}.bin`, encodeTensors(result));
