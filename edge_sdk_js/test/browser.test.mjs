// Conformance in a real browser: headless Chromium runs the same cases as conformance.test.mjs
// on onnxruntime-web, in a cross-origin isolated page served from 127.0.0.1. Skipped, with one
// line, where Debian's chromium is not installed (apt-get install chromium).
import assert from "node:assert/strict";
import { dirname } from "node:path";
import { test } from "node:test";
import { CHROMIUM, conformanceInPage, openPage, servePage } from "./browser.mjs";
import { referenceCases } from "./cases.mjs";
import { TOLERANCE } from "./conformance-core.mjs";

const CASES = (process.env.EDGETRAIN_JS_CONFORMANCE ?? "digits_mlp:2,resnet20:7").split(",");

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
