// Conformance tests of a set of cases in every runtime: onnxruntime-node, onnxruntime-web under Node,
// and headless Chromium (skipped, with one line, where it is not installed). Each case's loss,
// gradients, deltas after tau steps and evaluation are compared with the Python ONNX Runtime device's
// within docs/protocol.md's tolerances ("Conformance").
import assert from "node:assert/strict";
import { dirname } from "node:path";
import { test } from "node:test";
import { loadRuntime } from "../dist/index.js";
import { CHROMIUM, conformanceInPage, openPage, servePage } from "./browser.mjs";
import { loadCase, referenceCases } from "./cases.mjs";
import { TOLERANCE, runConformance } from "./conformance-core.mjs";

function check(name, where, { err, deltaNames }, expectedNames) {
  console.log(`# ${name} ${where}: ${JSON.stringify(err)}`);
  assert.deepEqual(deltaNames, expectedNames);
  for (const [key, limit] of Object.entries(TOLERANCE)) assert.ok(err[key] <= limit, `${name}: ${key} off by ${err[key]} > ${limit}`);
}

/** Registers one test per case and Node runtime, and one for all cases in a Chromium tab. */
export function conformanceSuite(cases, { timeout = 600_000 } = {}) {
  let folders = null;
  const cased = () => (folders ??= referenceCases(cases)); // exported by the Python device on first use
  for (const kind of ["node", "web"]) {
    for (const [i, name] of cases.entries()) {
      test(`${name} trains in onnxruntime-${kind} as in the Python device`, { timeout }, async () => {
        const c = loadCase(cased()[i]);
        const expected = Object.keys(c.expected).filter((k) => k.startsWith("delta:")).map((k) => k.slice(6)).sort();
        check(name, `onnxruntime-${kind}`, await runConformance(await loadRuntime(kind), c), expected);
      });
    }
  }
  const skip = CHROMIUM ? false : "chromium is not installed (apt-get install chromium): browser tests skipped";
  test(`${cases.join(", ")} train in a headless Chromium tab as in the Python device`, { skip, timeout }, async () => {
    const site = await servePage({ cases: dirname(cased()[0]) });
    const { browser, page } = await openPage(site.url);
    try {
      for (const [i, name] of cases.entries()) {
        const result = await conformanceInPage(page, cased()[i]);
        assert.ok(result.isolated, "the page is cross-origin isolated (COOP + COEP)");
        check(name, "chromium onnxruntime-web", result, result.expectedNames);
      }
    } finally {
      await browser.close();
      await site.close();
    }
  });
}
