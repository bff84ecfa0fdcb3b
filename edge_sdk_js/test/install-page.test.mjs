// The install page of a server with a local certificate authority (docs/web.md, "A phone on the LAN"):
// `edgetrain serve --web --web-tls local-ca` on 127.0.0.1 prints its plain-http install page; headless
// Chromium opens it once without the authority (a phone before it installs it) and once trusting it
// (an NSS database with the authority, test/lan.mjs). Before: "Open the device page" is not shown and
// the page says the phone does not trust the server yet; after: the button shows and leads to the https
// device page. Either way the page says what the authority may vouch for and names the certificate's
// addresses. Then the device page, in a browser with a WebGPU adapter (SwiftShader) at a budget below
// the GPU path's least: it trains on WebAssembly and says why. Skipped with one line where chromium is
// missing. In `make test-slow`.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { python } from "./cases.mjs";
import { freePort, start, tempDir } from "./fleet.mjs";
import { trustAuthority } from "./lan.mjs";
import { launchBrowser } from "./status-page.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** What the install page shows: whether the button is displayed, its link, the trust line, the authority's reach. */
async function installPage(browser, url, trusted) {
  const tab = await browser.newPage();
  await tab.goto(url);
  // The page checks /trust.json on the https port: trusted, it shows the button; else it says so and checks again.
  // Trusted, the wait also takes the button's layout (once seen on a loaded machine: the line said "trusts" and the button had
  // no box yet at the next read); its display is asserted below.
  await tab.waitForFunction((want) => document.getElementById("trust").textContent.includes(want ? "trusts the server" : "does not trust")
    && (!want || document.getElementById("open").getClientRects().length > 0),
    { timeout: 60_000, polling: 200 }, trusted);
  return tab.evaluate(() => {
    const open = document.getElementById("open");
    return { shown: open.getClientRects().length > 0 && getComputedStyle(open).display !== "none", hidden: open.hidden,
      href: open.href, trust: document.getElementById("trust").textContent,
      reach: [...document.querySelectorAll("p.muted")].map((p) => p.textContent.replace(/\s+/g, " ")).find((t) => t.includes("vouch")) };
  });
}

test("the install page shows 'Open the device page' only once the browser trusts the server, and says what the authority covers",
  { timeout: 300_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const dir = tempDir("edgetrain-js-install-");
    const port = await freePort();
    const server = start(dir, "server", python(), ["-m", "edgetrain.cli", "serve", "--web", "--web-tls", "local-ca",
      "--host", "127.0.0.1", "--port", String(port), "--web-http-port", String(await freePort()), "--store", join(dir, "store"),
      "--model", "digits_mlp", "--rounds", "1", "--min-devices", "1", "--json-events"]);
    const browsers = [];
    try {
      let install = null;
      for (let i = 0; i < 600 && install === null; i++) {
        install = /its local certificate authority: (\S+)/.exec(readFileSync(join(dir, "server.log"), "utf8"))?.[1] ?? null;
        if (server.exitCode !== null) throw new Error(`the server exited: ${readFileSync(join(dir, "server.log"), "utf8").slice(-2000)}`);
        if (install === null) await sleep(200);
      }
      assert.ok(install, "the server printed its install page");
      const before = await installPage(browsers[browsers.push(await launchBrowser()) - 1], install, false);
      assert.equal(before.hidden, true);
      assert.equal(before.shown, false, "'Open the device page' is not shown before the browser trusts the server");
      const trust = trustAuthority(join(dir, "store", "web-ca", "ca.pem"), join(dir, "home"));
      const after = await installPage(browsers[browsers.push(await launchBrowser(trust.args, { env: trust.env })) - 1], install, true);
      assert.equal(after.shown, true, `'Open the device page' is shown once the browser trusts the server (${trust.how})`);
      assert.equal(after.href, `https://127.0.0.1:${port}/`);
      for (const page of [before, after]) {
        assert.match(page.reach, /^It may vouch only for private network addresses, localhost and \.local names, never for another site/);
        assert.match(page.reach, /This server's certificate names 127\.0\.0\.1, localhost/);
      }

      // The device page in a browser with a WebGPU adapter: the GPU box is ticked, and a budget below the least
      // the server plans a tab on the GPU for trains on WebAssembly, saying why.
      const gpu = browsers[browsers.push(await launchBrowser(trust.args, { env: trust.env, webgpu: true })) - 1];
      const tab = await gpu.newPage();
      await tab.goto(`${after.href}?id=gpu-small&budget=400MiB&shard=0&autostart=1`);
      await tab.waitForFunction(() => window.edgetrain?.backend !== null || window.edgetrain?.error, { timeout: 120_000, polling: 200 });
      const path = await tab.evaluate(() => ({ backend: window.edgetrain.backend, error: window.edgetrain.error,
        box: document.getElementById("webgpu").checked, runtime: document.getElementById("runtime").textContent }));
      console.log(`# the GPU browser at 400 MiB: ${path.runtime}`);
      assert.equal(path.error, null);
      assert.equal(path.box, true, "the GPU box is ticked where the browser gives an adapter");
      assert.equal(path.backend, "onnxruntime-web");
      assert.match(path.runtime, /^onnxruntime-web \(WebAssembly, \d threads?; the GPU needs a budget of \d+ MiB\)$/);
    } finally {
      for (const b of browsers) await b.close();
      if (server.exitCode === null) server.kill();
    }
  });
