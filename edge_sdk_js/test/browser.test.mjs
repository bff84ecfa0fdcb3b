// Conformance in a real browser: headless Chromium runs the same cases as conformance.test.mjs
// on onnxruntime-web, in a cross-origin isolated page served from 127.0.0.1. Skipped, with one
// line, where Debian's chromium is not installed (apt-get install chromium).
import assert from "node:assert/strict";
import { basename, dirname } from "node:path";
import { test } from "node:test";
import { CHROMIUM, openPage, servePage } from "./browser.mjs";
import { referenceCases } from "./cases.mjs";
import { TOLERANCE } from "./conformance-core.mjs";

const CASES = (process.env.EDGETRAIN_JS_CONFORMANCE ?? "digits_mlp:3,resnet20:7").split(",");

/** Run one case inside the page (files fetched from /cases/<folder>/). */
export async function conformanceInPage(page, folder) {
  return page.evaluate(async (base) => {
    const { decodeTensors, makeRuntime } = window.sdk;
    const bytes = async (name) => {
      const res = await fetch(`${base}/${name}`);
      if (!res.ok) throw new Error(`${name}: ${res.status}`);
      return new Uint8Array(await res.arrayBuffer());
    };
    const summary = JSON.parse(new TextDecoder().decode(await bytes("expected.json")));
    const chunks = [];
    for (let i = 0; i < summary.chunks; i++) chunks.push(await bytes(`chunk-${i}.onnx`));
    const c = { chunks, graph: await bytes("graph.bin"), state: decodeTensors(await bytes("state.bin")),
      data: decodeTensors(await bytes("data.bin")), plan: decodeTensors(await bytes("plan.bin")),
      expected: decodeTensors(await bytes("expected.bin")), summary };
    const { runConformance } = await import("/test/conformance-core.mjs");
    const result = await runConformance(makeRuntime("onnxruntime-web", window.ort, 1), c);
    return { ...result, isolated: window.crossOriginIsolated,
      expectedNames: Object.keys(c.expected).filter((k) => k.startsWith("delta:")).map((k) => k.slice(6)).sort() };
  }, `/cases/${basename(folder)}`);
}

test("the training graphs train in headless Chromium as in the Python device", { skip: CHROMIUM ? false : "chromium is not installed (apt-get install chromium): browser tests skipped", timeout: 240_000 }, async () => {
  const folders = referenceCases(CASES);
  const site = await servePage({ cases: dirname(folders[0]) });
  const { browser, page } = await openPage(site.url);
  try {
    for (const [i, name] of CASES.entries()) {
      const { err, deltaNames, expectedNames, isolated } = await conformanceInPage(page, folders[i]);
      console.log(`# ${name} chromium onnxruntime-web: ${JSON.stringify(err)}`);
      assert.ok(isolated, "the page is cross-origin isolated (COOP + COEP)");
      assert.deepEqual(deltaNames, expectedNames);
      for (const [key, limit] of Object.entries(TOLERANCE)) assert.ok(err[key] <= limit, `${name}: ${key} off by ${err[key]} > ${limit}`);
    }
  } finally {
    await browser.close();
    await site.close();
  }
});
