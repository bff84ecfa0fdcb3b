// `edgetrain serve --web` end to end: the device page and the SDK come with the cross-origin
// isolation headers; two headless Chromium tabs open the device page and train every round of a
// mixed fleet (a Python device, a Node device, the tabs): one in a browser without a WebGPU
// adapter, which trains on WebAssembly and says so, one in a browser with one (SwiftShader), which
// trains on the GPU and says so; the status page, open in another tab during the run, shows every
// device and the round count the journal has (read from its DOM).
// Skipped with one line where chromium is not installed (apt-get install chromium).
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { HERE, python } from "./cases.mjs";
import { journal, start, startServer, tempDir, writeShards } from "./fleet.mjs";
import { launchBrowser, statusMatchesJournal, waitForRounds } from "./status-page.mjs";

const ROUNDS = 2;
const TOKEN = "web-test-token";

function deviceConfig(dir, url, shard) {
  const file = join(dir, "node-2.toml");
  writeFileSync(file, `server = "${url}"\nid = "node-2"\nbudget = "185MiB"\ndata = ${JSON.stringify(shard)}\n`
    + `runtime = "node"\ntoken = "${TOKEN}"\njson-events = true\nonce = true\n`); // weak, as the tab: one training graph to export
  return file;
}

test("serve --web: a tab trains from the device page; the status page shows the journal's devices and rounds",
  { timeout: 420_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const dir = tempDir("edgetrain-js-web-");
    const shards = writeShards(dir, [2], 3);
    const { server, url } = await startServer(dir, ["--web", "--token", TOKEN, "--model", "digits_mlp",
      "--rounds", String(ROUNDS), "--min-devices", "4", "--local-steps", "3", "--deadline", "150"]);
    const site = url.replace("ws://", "http://");
    const browser = await launchBrowser();
    const gpuBrowser = await launchBrowser([], { webgpu: true });
    const browsers = [];
    const devices = [];
    try {
      // The page and the SDK's files carry the isolation headers; the status needs the token.
      for (const path of ["/", "/sdk/dist/index.js", "/sdk/ort/ort.wasm.min.mjs", "/shard/1.bin"]) {
        const res = await fetch(site + path);
        assert.equal(res.status, 200, path);
        assert.equal(res.headers.get("cross-origin-opener-policy"), "same-origin", path);
        assert.equal(res.headers.get("cross-origin-embedder-policy"), "require-corp", path);
      }
      assert.equal((await fetch(`${site}/sdk/dist/../package.json`)).status, 404);
      assert.equal((await fetch(`${site}/status.json`)).status, 401);
      assert.equal((await fetch(`${site}/status.json`, { headers: { Authorization: "Bearer wrong" } })).status, 401);

      // The status page in a browser of its own: brought to the front in the device tabs' browser it would
      // hide them, and a hidden device page pauses (leaves between rounds).
      const statusBrowser = await launchBrowser();
      browsers.push(statusBrowser);
      const status = await statusBrowser.newPage();
      await status.goto(`${site}/status#token=${TOKEN}`);
      const tab = await browser.newPage();
      tab.on("pageerror", (err) => console.error(`# device page error: ${err.message}`));
      await tab.goto(`${site}/?id=tab-1&budget=400MiB&shard=1&autostart=1#token=${TOKEN}`);
      const gpuTab = await gpuBrowser.newPage();
      gpuTab.on("pageerror", (err) => console.error(`# device page (WebGPU) error: ${err.message}`));
      await gpuTab.goto(`${site}/?id=tab-gpu&budget=530MiB&shard=3&autostart=1#token=${TOKEN}`); // weak on WebGPU's figure (the least: 526 MiB)
      devices.push(
        start(dir, "py-0", python(), ["-m", "edge_sdk", "--server", url, "--id", "py-0", "--budget", "2GiB", "--data", "digits",
          "--client", "0", "--num-clients", "3", "--token", TOKEN, "--json-events", "--once"]),
        // a board without Python, from a config file like the Python device's
        start(dir, "node-2", process.execPath, [`${HERE}/../dist/cli.js`, "--config", deviceConfig(dir, url, shards[2])],
          process.env));

      await status.bringToFront();
      await waitForRounds(status, 1);
      const { journal: j, shown } = await statusMatchesJournal(status, dir);
      assert.deepEqual(Object.keys(j.devices).sort(), ["node-2", "py-0", "tab-1", "tab-gpu"]);
      // The status page's "trained on": what each tab's last report says trained it.
      assert.deepEqual([shown.devices["tab-1"][7], shown.devices["tab-gpu"][7]], ["onnxruntime-web", "onnxruntime-webgpu"]);

      const seen = async (t) => {
        await t.waitForFunction(() => ["finished", "stopped"].includes(window.edgetrain?.state), { timeout: 300_000, polling: 500 });
        return t.evaluate(() => ({ ...window.edgetrain, isolated: window.crossOriginIsolated,
          role: document.getElementById("role").textContent, split: document.getElementById("split").textContent,
          rounds: document.getElementById("rounds").textContent, runtime: document.getElementById("runtime").textContent,
          events: undefined }));
      };
      // The GPU box: unticked and disabled, with the reason, where the browser gives no adapter; ticked where it does.
      const box = (t) => t.evaluate(() => ({ checked: document.getElementById("webgpu").checked,
        disabled: document.getElementById("webgpu").disabled, note: document.getElementById("webgpu-note").textContent }));
      assert.deepEqual(await box(tab), { checked: false, disabled: true, note: "(no WebGPU adapter: WebAssembly)" });
      assert.deepEqual(await box(gpuTab), { checked: true, disabled: false, note: "" });
      const [page, gpuPage] = [await seen(tab), await seen(gpuTab)];
      for (const p of [page, gpuPage]) {
        assert.equal(p.error, null, `the device page stopped: ${p.error}`);
        assert.equal(p.isolated, true, "the device page is cross-origin isolated (WebAssembly threads)");
        assert.equal(Number(p.rounds), ROUNDS);
      }
      // Which path trains, on the page: WebAssembly where the browser has no adapter, else the GPU.
      assert.equal(page.backend, "onnxruntime-web");
      assert.match(page.runtime, /WebAssembly.*no WebGPU adapter/);
      assert.equal(gpuPage.backend, "onnxruntime-webgpu");
      assert.match(gpuPage.runtime, /on the GPU \(WebGPU: google swiftshader\)/);
      assert.deepEqual(await Promise.all(devices.map((d) => d.done)), [0, 0], `device exit codes (logs in ${dir})`);
      assert.equal(await server.done, 0);
      const final = journal(dir);
      assert.deepEqual(final.devices["tab-1"].runtimes, ["onnxruntime-web"]);
      assert.equal(page.role, final.devices["tab-1"].role, "the page shows the role the server planned");
      assert.equal(Number(page.split), final.devices["tab-1"].split, "the page shows the split the server planned");
      assert.equal(final.rounds.filter((r) => r.finished).length, ROUNDS);
      assert.equal(final.reports.filter((r) => r.device === "tab-1" && r.accepted === 1).length, ROUNDS);
      assert.deepEqual(final.devices["tab-gpu"].runtimes, ["onnxruntime-webgpu", "onnxruntime-web"]);
      assert.equal(final.devices["tab-gpu"].backend, "onnxruntime-webgpu", "planned on the GPU's runtime");
      assert.deepEqual(final.reports.filter((r) => r.device === "tab-gpu" && r.accepted === 1).map((r) => r.backend),
        Array(ROUNDS).fill("onnxruntime-webgpu"), "every round trained on the GPU, as its reports say");
      console.log(`# status page matched the journal at ${shown.roundsDone} rounds; tab-1 ${page.role} split ${page.split}`);
    } finally {
      for (const p of [server, ...devices]) if (p.exitCode === null) p.kill();
      await browser.close();
      await gpuBrowser.close();
      for (const b of browsers) await b.close();
    }
  });
