// One run of an ONNX graph in a JavaScript runtime, for bench/relu_sides.py:
//
//   node bench/graph-run.mjs <folder> node|web|webgpu
//
// reads <folder>/graph.onnx and <folder>/feed.bin (tensors, edge_sdk.protocol encoding), runs the
// graph once with the device's session settings and writes every output to <folder>/out-<kind>.bin.
// `webgpu`: in a headless Chromium tab, on the WebGPU backend's GPU runtime (SwiftShader here).
import { readFileSync, writeFileSync } from "node:fs";
import { decodeTensors, encodeTensors, loadRuntime, openSession, tensor } from "../dist/index.js";
import { openPage, servePage } from "../test/browser.mjs";

const [folder, kind] = process.argv.slice(2);
if (kind === "webgpu") {
  const site = await servePage({ run: folder });
  const { browser, page } = await openPage(site.url, { webgpu: true });
  const out = await page.evaluate(async () => {
    const { sdk, ort } = window;
    const bytes = async (n) => new Uint8Array(await (await fetch(`/run/${n}`)).arrayBuffer());
    const backend = new sdk.WebGpuBackend(sdk.makeRuntime("onnxruntime-web", ort, 1), 1);
    const probe = await backend.probe();
    if (probe.off) throw new Error(`no WebGPU: ${probe.off}`);
    const session = await sdk.openSession(backend.gpu, await bytes("graph.onnx"));
    const feed = {};
    for (const [name, t] of Object.entries(sdk.decodeTensors(await bytes("feed.bin")))) feed[name] = new ort.Tensor(t.dtype, t.data, t.shape);
    const outputs = await session.run(feed);
    const result = {};
    for (const [name, t] of Object.entries(outputs)) result[name] = sdk.tensor(t.type, Array.from(t.dims), t.data);
    const encoded = sdk.encodeTensors(result);
    let binary = "";
    for (let i = 0; i < encoded.length; i += 0x8000) binary += String.fromCharCode(...encoded.subarray(i, i + 0x8000));
    return btoa(binary); // one string over the DevTools protocol, not an array of numbers
  });
  writeFileSync(`${folder}/out-${kind}.bin`, Buffer.from(out, "base64"));
  await browser.close();
  await site.close();
} else {
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
}
process.exit(0);
