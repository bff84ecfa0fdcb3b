// The WebGPU backend in headless Chromium: where the browser offers no adapter the tab trains on
// WebAssembly and says so; a tab whose GPU device is lost mid-round, or whose WebGPU session does
// not open, finishes the round on WebAssembly with the WebAssembly backend's update, says why, and
// trains on WebAssembly from then on. Chromium's adapter here is SwiftShader (a CPU Vulkan):
// correct, slow. The conformance of every zoo model's tab splits on WebGPU is webgpu-conformance.test.mjs.
import assert from "node:assert/strict";
import { dirname } from "node:path";
import { test } from "node:test";
import { CHROMIUM, backendInPage, openPage, servePage } from "./browser.mjs";
import { referenceCases } from "./cases.mjs";

const skip = CHROMIUM ? false : "chromium is not installed (apt-get install chromium): browser tests skipped";
// A small tail (two linear blocks, five steps): each WebGPU run on SwiftShader takes about a second.
const CASE = "tiny:0";

/** `check(page, folder)` in a tab that loads the WebGPU build, in a browser with an `adapter` or without. */
async function inTab(adapter, check) {
  const [folder] = referenceCases([CASE]);
  const site = await servePage({ cases: dirname(folder) });
  const { browser, page } = await openPage(site.url, { webgpu: true, adapter });
  try {
    await check(page, folder);
  } finally {
    await browser.close();
    await site.close();
  }
}

test("a tab without a WebGPU adapter trains on WebAssembly and says so", { skip, timeout: 300_000 }, () =>
  inTab(false, async (page, folder) => {
    const r = await backendInPage(page, folder);
    assert.equal(r.probe.off, "no WebGPU adapter");
    assert.deepEqual(r.metrics, { backend: "onnxruntime-web", webgpu_fallback: "no WebGPU adapter" });
    assert.deepEqual(r.after.runtimes, ["onnxruntime-web"], "the hello names WebAssembly alone");
    assert.equal(r.vsWasm, 0, "the update is the WebAssembly backend's");
  }));

test("a tab that loses its GPU mid-round finishes the round on WebAssembly", { skip, timeout: 300_000 }, () =>
  inTab(true, async (page, folder) => {
    // Runs after the probe: the evaluation before training, then the training steps; the device is
    // destroyed before the third, the second training step.
    const r = await backendInPage(page, folder, { loseAt: 3 });
    assert.equal(r.probe.adapter.architecture, "swiftshader", JSON.stringify(r.probe));
    assert.equal(r.runs, 3, "the GPU ran until its device was destroyed, and no more");
    assert.equal(r.metrics.backend, "onnxruntime-web");
    assert.match(r.metrics.webgpu_fallback, /lost|destroyed/i);
    assert.match(r.metrics.webgpu_adapter, /swiftshader/);
    assert.deepEqual(r.names, r.wasmNames);
    assert.equal(r.vsWasm, 0, "the round's update is exactly the WebAssembly backend's");
    assert.deepEqual(r.after.runtimes, ["onnxruntime-web"], "later hellos name WebAssembly alone");
  }));

test("a tab whose WebGPU session does not open trains on WebAssembly", { skip, timeout: 300_000 }, () =>
  inTab(true, async (page, folder) => {
    const r = await backendInPage(page, folder, { failOpen: true });
    assert.equal(r.runs, 0);
    assert.equal(r.metrics.backend, "onnxruntime-web");
    assert.match(r.metrics.webgpu_fallback, /opening a WebGPU session failed: injected/);
    assert.equal(r.vsWasm, 0);
  }));

test("a tab with an adapter trains on the GPU", { skip, timeout: 300_000 }, () =>
  inTab(true, async (page, folder) => {
    const r = await backendInPage(page, folder);
    assert.equal(r.metrics.backend, "onnxruntime-webgpu", JSON.stringify(r.metrics));
    assert.equal(r.metrics.webgpu_fallback, undefined);
    assert.ok(r.runs >= 7, `the evaluations and the five steps ran on the GPU (${r.runs} runs)`);
    assert.ok(r.vsWasm < 1e-4, `the GPU's update is WebAssembly's within rounding (${r.vsWasm})`);
    assert.deepEqual(r.after.runtimes, ["onnxruntime-webgpu", "onnxruntime-web"]);
  }));
