// `edgetrain serve --web` end to end: the device page and the SDK come with the cross-origin
// isolation headers; a headless Chromium tab opens the device page and trains every round of a
// mixed fleet (a Python device, a Node device, the tab); the status page, open in another tab
// during the run, shows every device and the round count the journal has (read from its DOM).
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
  { timeout: 300_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const dir = tempDir("edgetrain-js-web-");
    const shards = writeShards(dir, [2], 3);
    const { server, url } = await startServer(dir, ["--web", "--token", TOKEN, "--model", "digits_mlp",
      "--rounds", String(ROUNDS), "--min-devices", "3", "--local-steps", "3", "--deadline", "90"]);
    const site = url.replace("ws://", "http://");
    const browser = await launchBrowser();
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

      const status = await browser.newPage();
      await status.goto(`${site}/status#token=${TOKEN}`);
      const tab = await browser.newPage();
      tab.on("pageerror", (err) => console.error(`# device page error: ${err.message}`));
      await tab.goto(`${site}/?id=tab-1&budget=330MiB&shard=1&autostart=1#token=${TOKEN}`);
      devices.push(
        start(dir, "py-0", python(), ["-m", "edge_sdk", "--server", url, "--id", "py-0", "--budget", "2GiB", "--data", "digits",
          "--client", "0", "--num-clients", "3", "--token", TOKEN, "--json-events", "--once"]),
        // a board without Python, from a config file like the Python device's
        start(dir, "node-2", process.execPath, [`${HERE}/../dist/cli.js`, "--config", deviceConfig(dir, url, shards[2])],
          process.env));

      await status.bringToFront();
      await waitForRounds(status, 1);
      const { journal: j, shown } = await statusMatchesJournal(status, dir);
      assert.deepEqual(Object.keys(j.devices).sort(), ["node-2", "py-0", "tab-1"]);

      await tab.waitForFunction(() => ["finished", "stopped"].includes(window.edgetrain?.state), { timeout: 240_000, polling: 500 });
      const page = await tab.evaluate(() => ({ ...window.edgetrain, isolated: window.crossOriginIsolated,
        role: document.getElementById("role").textContent, split: document.getElementById("split").textContent,
        rounds: document.getElementById("rounds").textContent, events: undefined }));
      assert.equal(page.error, null, `the device page stopped: ${page.error}`);
      assert.equal(page.isolated, true, "the device page is cross-origin isolated (WebAssembly threads)");
      assert.equal(Number(page.rounds), ROUNDS);
      assert.deepEqual(await Promise.all(devices.map((d) => d.done)), [0, 0], `device exit codes (logs in ${dir})`);
      assert.equal(await server.done, 0);
      const final = journal(dir);
      assert.deepEqual(final.devices["tab-1"].runtimes, ["onnxruntime-web"]);
      assert.equal(page.role, final.devices["tab-1"].role, "the page shows the role the server planned");
      assert.equal(Number(page.split), final.devices["tab-1"].split, "the page shows the split the server planned");
      assert.equal(final.rounds.filter((r) => r.finished).length, ROUNDS);
      assert.equal(final.reports.filter((r) => r.device === "tab-1" && r.accepted === 1).length, ROUNDS);
      console.log(`# status page matched the journal at ${shown.roundsDone} rounds; tab-1 ${page.role} split ${page.split}`);
    } finally {
      for (const p of [server, ...devices]) if (p.exitCode === null) p.kill();
      await browser.close();
    }
  });
