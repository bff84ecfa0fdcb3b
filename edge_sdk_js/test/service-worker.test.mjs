// The device page's service worker when its install fails: the worker says which file and why, the page logs
// it and registers again after a pause, and the install that follows once the file is there keeps the page
// (ready, serving it). A real `serve --web` over a copy of the SDK's files with onnxruntime-web's
// WebAssembly left out, as a server whose file did not come in time; then the file is put back.
// Skipped with one line where chromium is missing.
import assert from "node:assert/strict";
import { copyFileSync, cpSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { CHROMIUM } from "./browser.mjs";
import { startServer, tempDir } from "./fleet.mjs";
import { launchBrowser } from "./status-page.mjs";

const SDK = join(dirname(fileURLToPath(import.meta.url)), "..");
const ORT = join("node_modules", "onnxruntime-web", "dist");
const WASM = "ort-wasm-simd-threaded.wasm";

test("a failed service worker install is logged with its file, and the page registers again until one is in",
  { timeout: 180_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const dir = tempDir("edgetrain-js-sw-");
    const sdk = join(dir, "sdk");
    cpSync(join(SDK, "dist"), join(sdk, "dist"), { recursive: true });
    mkdirSync(join(sdk, ORT), { recursive: true });
    for (const name of ["ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs"]) copyFileSync(join(SDK, ORT, name), join(sdk, ORT, name));
    const { server, url } = await startServer(dir, ["--web", "--web-sdk", sdk, "--model", "digits_mlp", "--rounds", "1",
      "--min-devices", "5"]);
    const browser = await launchBrowser();
    try {
      const page = await browser.newPage();
      await page.goto(`${url.replace("ws://", "http://")}/`);
      const failed = () => window.edgetrain.events.filter((e) => e.event === "service_worker");
      await page.waitForFunction(() => {
        const log = window.edgetrain.events.filter((e) => e.event === "service_worker");
        return log.some((e) => e.error === "the install failed" && e.retry === true) && log.some((e) => e.error?.startsWith("/sdk/"));
      }, { timeout: 60_000, polling: 100 });
      const log = await page.evaluate(failed);
      assert.ok(log.some((e) => e.error === `/sdk/ort/${WASM}: HTTP 404`), `the worker named the file: ${JSON.stringify(log)}`);
      assert.equal(await page.evaluate(async () => (await navigator.serviceWorker.getRegistration())?.active ?? null), null,
        "no worker is active after a failed install");
      copyFileSync(join(SDK, ORT, WASM), join(sdk, ORT, WASM));
      const active = await page.evaluate(() => Promise.race([navigator.serviceWorker.ready.then((r) => r.active?.state),
        new Promise((resolve) => setTimeout(() => resolve("not ready in 60 s"), 60_000))]));
      assert.ok(["activating", "activated"].includes(active), `an install after the file is back takes (${active}): ${JSON.stringify(await page.evaluate(failed))}`);
      const kept = await page.evaluate(async (w) => (await caches.keys()).length > 0
        && (await caches.match(`/sdk/ort/${w}`)) !== undefined, WASM);
      assert.ok(kept, "the WebAssembly is in the worker's cache");
      console.log(`# the page's log: ${JSON.stringify(await page.evaluate(failed))}`);
    } finally {
      await browser.close();
      server.kill();
    }
  });
