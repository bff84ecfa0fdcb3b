// The README's phone flow on a LAN (docs/web.md, "A phone on the LAN"), with a headless Chromium as the
// phone: `edgetrain serve --web --host 0.0.0.0` runs in a network namespace of the test's own and prints
// an https device page at its LAN address and the plain-http page of its local certificate authority;
// Chromium trusts that authority as a phone that installed it (test/lan.mjs says how) and opens the
// page at 390x844 with the page's own defaults (no query, a tap on "Join and train"):
//   - the page is a secure context and cross-origin isolated, is offered a budget the server plans (not
//     less than /budget.json's least), joins, and trains every round of the run;
//   - installed (service worker): with the server gone it reloads to its form, and trains again when the
//     server is back (`serve --resume`); hidden it pauses (leaves between rounds), shown it comes back
//     and trains; closed mid-run and opened again it is selected again and shows the journal's rounds;
//   - the SDK and onnxruntime-web come gzip-compressed on the first visit and from the service worker,
//     with nothing from the server, on the next.
// Skipped with one line where chromium is missing or a network namespace cannot be made (root).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { python } from "./cases.mjs";
import { journal, start, tempDir } from "./fleet.mjs";
import { lanNamespace, recordNetwork, trustAuthority } from "./lan.mjs";
import { launchBrowser } from "./status-page.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const PORT = 18000 + (process.pid % 1000) * 2;
const lan = CHROMIUM === undefined ? "chromium is not installed (apt-get install chromium)" : lanNamespace();
// The resumed run's rounds. Round 3 trains back on line, then the page is hidden, shown and trains, then
// closed and reopened. Hiding and closing can each cost a round (a page selected as it leaves is that
// round's straggler, and a round whose whole cohort left closes at once), so the reopened page can come
// back as late as round 6; the run goes on to 8 so that a round is still to come for it.
const RESUMED_ROUNDS = 8;
const ID_OF = () => window.edgetrain?.events.find((e) => e.event === "welcome")?.device;

/** `serve --web --host 0.0.0.0` in the namespace; resolves once it printed its pages. */
async function serveOnLan(dir, ns, rounds, extra = []) {
  const [command, args] = ns.wrap(python(), ["-m", "edgetrain", "serve", "--web", "--host", "0.0.0.0",
    "--port", String(PORT), "--store", join(dir, "store"), "--model", "digits_mlp", "--rounds", String(rounds),
    "--min-devices", "1", "--local-steps", "5", "--deadline", "200", "--straggler-policy", "deadline", "--json-events", ...extra]);
  const server = start(dir, `server-${rounds}`, command, args);
  for (let i = 0; i < 600; i++) {
    const log = readFileSync(join(dir, `server-${rounds}.log`), "utf8");
    const page = /device page: (\S+)/.exec(log);
    const install = /its local certificate authority: (\S+)/.exec(log);
    if (page && install) return { server, page: page[1], install: install[1], log };
    if (server.exitCode !== null) throw new Error(`the server exited: ${log.slice(-2000)}`);
    await sleep(200);
  }
  throw new Error("the server printed no device page");
}

const show = (tab) => tab.evaluate(() => ({ state: window.edgetrain.state, rounds: Number(document.getElementById("rounds").textContent),
  events: window.edgetrain.events.map((e) => e.event), error: window.edgetrain.error }));

function waitFor(tab, predicate, arg, timeout = 300_000) {
  return tab.waitForFunction(predicate, { timeout, polling: 250 }, arg);
}

function accepted(dir, device) {
  return journal(dir).reports.filter((r) => r.device === device && r.phase === "train" && r.accepted === 1).map((r) => r.round);
}

test("a phone on the LAN: https from a local authority, isolated, its own budget, trains; offline, hidden, reopened",
  { timeout: 1_500_000, skip: typeof lan === "string" && lan }, async () => {
    const dir = tempDir("edgetrain-js-lan-");
    let first = null;
    let second = null;
    let browser = null;
    try {
      // -- the run's first part: two rounds, the page with its own defaults --------------------------------
      first = await serveOnLan(dir, lan, 2);
      assert.equal(first.page, `https://${lan.server}:${PORT}/`, "the printed URL is https at the LAN address");
      assert.equal(first.install, `http://${lan.server}:${PORT + 1}/`);
      const trust = trustAuthority(join(dir, "store", "web-ca", "ca.pem"), join(dir, "home"));
      console.log(`# Chromium trusts the authority through: ${trust.how}`);
      const install = await (await fetch(first.install)).text();
      assert.match(install, /SHA-256 fingerprint/);
      assert.match(first.log, /fingerprint: ([0-9A-F]{2}:){31}[0-9A-F]{2}/);
      browser = await launchBrowser(trust.args, { env: trust.env });
      const tab = await browser.newPage();
      await tab.setViewport({ width: 390, height: 844, isMobile: true });
      tab.on("pageerror", (err) => console.error(`# device page error: ${err.message}`));
      const visit1 = await recordNetwork(tab, browser);
      await tab.goto(first.page);
      await waitFor(tab, () => document.getElementById("budget").dataset.auto === "1" && !document.getElementById("start").disabled);
      const page = await tab.evaluate(async () => ({ isolated: crossOriginIsolated, secure: isSecureContext,
        budget: document.getElementById("budget").value, source: window.edgetrain.budgetSource,
        // (bounded: the page registers again where an install fails, a few times, then gives up)
        sw: await Promise.race([navigator.serviceWorker.ready.then((r) => r.active !== null),
          new Promise((resolve) => setTimeout(() => resolve(false), 120_000))]),
        worker: await navigator.serviceWorker.getRegistration().then((r) => r === undefined ? "no registration"
          : `installing ${r.installing?.state}, waiting ${r.waiting?.state}, active ${r.active?.state}`),
        swEvents: window.edgetrain.events.filter((e) => e.event === "service_worker") }));
      assert.equal(page.secure, true, "https at a LAN address from a trusted authority is a secure context");
      assert.equal(page.isolated, true, "the device page is cross-origin isolated (WebAssembly threads)");
      assert.equal(page.sw, true, `the service worker is installed (${page.worker}; the page's log: ${JSON.stringify(page.swEvents)})`);
      await tab.click("#start");
      await waitFor(tab, () => window.edgetrain.events.some((e) => e.event === "welcome"));
      const least = await tab.evaluate(async () => (await (await fetch(
        `/budget.json?samples=${parseInt(document.getElementById("samples").textContent, 10)}`)).json()).budget_bytes);
      await waitFor(tab, () => ["finished", "stopped"].includes(window.edgetrain?.state));
      const after1 = await show(tab);
      const id = await tab.evaluate(ID_OF);
      assert.equal(after1.state, "finished", `the page stopped: ${after1.error}`);
      assert.equal(await first.server.done, 0);
      const j1 = journal(dir);
      assert.deepEqual(accepted(dir, id), [1, 2], "the page trained every round of the run");
      assert.equal(after1.rounds, 2);
      const budgetMiB = Number(/^(\d+)MiB$/.exec(page.budget)?.[1]);
      assert.ok(j1.devices[id].role, "the server planned the page at the budget it offered");
      console.log(`# page: ${page.budget} ${page.source}; ${id} ${j1.devices[id].role} split ${j1.devices[id].split}`);
      visit1.stop();
      const sdk1 = visit1.responses().filter((r) => new URL(r.url).pathname.startsWith("/sdk/"));
      const wasm = sdk1.filter((r) => r.url.endsWith(".wasm")).sort((a, b) => b.bytes - a.bytes)[0];
      assert.equal(wasm?.encoding, "gzip", "the WebAssembly comes gzip-compressed");
      assert.ok(wasm.bytes < 5_000_000, `the WebAssembly's ${wasm.bytes} bytes on the wire are the gzipped size`);
      console.log(`# first visit: ${visit1.responses().reduce((a, r) => a + r.bytes, 0)} bytes over the network, `
        + `${sdk1.reduce((a, r) => a + r.bytes, 0)} of them the SDK and onnxruntime-web (wasm ${wasm.bytes}): `
        + JSON.stringify(sdk1.map((r) => [new URL(r.url).pathname, r.where, r.bytes, r.encoding])));
      assert.ok(budgetMiB * 2 ** 20 >= least, `the offered ${page.budget} is at least the ${least} bytes the server plans for`);

      // -- offline: the installed page reloads to its form; trains again when the server is back ---------------
      await tab.reload();
      await waitFor(tab, () => document.getElementById("run").textContent.startsWith("digits_mlp"));
      assert.match(await tab.evaluate(() => document.getElementById("run").textContent), /digits_mlp: 2 rounds/,
        "with the server gone, the page opens from the service worker with the run it last saw");
      second = await serveOnLan(dir, lan, RESUMED_ROUNDS, ["--resume"]);
      await waitFor(tab, (n) => Number(document.getElementById("rounds").textContent) >= n, 3);
      assert.ok(accepted(dir, id).includes(3), "back on line, the page trained the resumed run's first round");

      // -- hidden: leaves between rounds, comes back when shown -------------------------------------------------
      const other = await browser.newPage();
      await other.bringToFront();
      await waitFor(tab, () => window.edgetrain.events.some((e) => e.event === "paused"));
      assert.equal(await tab.evaluate(() => document.visibilityState), "hidden");
      const pausedAt = accepted(dir, id).length;
      // It leaves once the round at hand is done (a busy machine's round takes a while): wait for its goodbye.
      const left = new RegExp(`"event": "disconnected", "device": "${id}"`);
      for (let i = 0; i < 600 && !left.test(readFileSync(join(dir, `server-${RESUMED_ROUNDS}.log`), "utf8")); i++) await sleep(500);
      assert.match(readFileSync(join(dir, `server-${RESUMED_ROUNDS}.log`), "utf8"), left, "a hidden page leaves the run (a goodbye between rounds)");
      await tab.bringToFront();
      await waitFor(tab, (n) => Number(document.getElementById("rounds").textContent) > n, pausedAt);
      assert.ok((await show(tab)).events.includes("resumed"));

      // -- reopened: closed during a round, opened again: selected again, shows the journal's rounds ------------
      await tab.close();
      const before = accepted(dir, id).length;
      const again = await browser.newPage();
      await again.setViewport({ width: 390, height: 844, isMobile: true });
      const visit2 = await recordNetwork(again);
      await again.goto(first.page); // joined before: the page joins again by itself
      await waitFor(again, () => ["finished", "stopped"].includes(window.edgetrain?.state), undefined, 600_000);
      const end = await show(again);
      assert.equal(end.state, "finished", `the reopened page stopped: ${end.error}`);
      assert.equal(await second.server.done, 0);
      const rounds = accepted(dir, id);
      assert.ok(rounds.length > before, `the reopened page was selected again (rounds ${rounds})`);
      assert.equal(end.rounds, rounds.length, "the reopened page shows the device's rounds in the journal");
      const sdk2 = visit2.responses().filter((r) => new URL(r.url).pathname.startsWith("/sdk/"));
      assert.ok(sdk2.length >= 3 && sdk2.every((r) => r.fromServiceWorker && r.bytes === 0),
        `the second visit takes the SDK and onnxruntime-web from the service worker: ${JSON.stringify(sdk2)}`);
      console.log(`# second visit: ${visit2.responses().reduce((a, r) => a + r.bytes, 0)} bytes over the network, 0 for `
        + `${sdk2.length} SDK files; journal rounds of ${id}: ${rounds}`);
      await other.close();
    } finally {
      for (const s of [first, second]) if (s && s.server.exitCode === null) s.server.kill();
      await browser?.close();
      lan.close?.();
    }
  });
