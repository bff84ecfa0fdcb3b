// The status page (`serve --web`, /status) in headless Chromium, read from its DOM and compared
// with the server's journal.
import assert from "node:assert/strict";
import { CHROMIUM, CHROMIUM_FLAGS, WEBGPU_FLAGS } from "./browser.mjs";
import { journal } from "./fleet.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * A headless Chromium whose tabs all keep their timers (the status page polls while another tab
 * trains); `webgpu`: one that offers its tabs a WebGPU adapter (SwiftShader); `env`: its environment.
 */
export async function launchBrowser(extraArgs = [], { webgpu = false, env = process.env } = {}) {
  const { default: puppeteer } = await import("puppeteer-core");
  return puppeteer.launch({ executablePath: CHROMIUM, headless: true, env, args: [...(webgpu ? WEBGPU_FLAGS : CHROMIUM_FLAGS), ...extraArgs,
    "--disable-background-timer-throttling", "--disable-renderer-backgrounding", "--disable-backgrounding-occluded-windows"],
    protocolTimeout: 0 }); // a wait for the rounds of a fleet with a GPU tab on SwiftShader outlasts the default 180 s
}

/** What the status page's DOM shows: device rows (id -> cells) and the rounds done. */
export function readStatus(page) {
  return page.evaluate(() => ({
    roundsDone: Number(document.getElementById("rounds-done").textContent),
    devices: Object.fromEntries([...document.querySelectorAll("#devices tr")].map((tr) =>
      [tr.dataset.device, [...tr.children].map((td) => td.textContent)])),
    doneRows: [...document.querySelectorAll("#rounds tr")].filter((tr) => tr.children[1].textContent === "done")
      .map((tr) => Number(tr.dataset.round)).sort((a, b) => a - b),
  }));
}

/** Wait until the status page shows at least `rounds` rounds done. */
export function waitForRounds(page, rounds, timeout = 240_000) {
  return page.waitForFunction((n) => Number(document.getElementById("rounds-done")?.textContent) >= n,
    { timeout, polling: 500 }, rounds);
}

/**
 * Journal, page, journal again until the page shows the journal's devices and finished rounds while
 * the journal stood still; then each device's runtime, role and split on the page are the journal's.
 */
export async function statusMatchesJournal(page, dir) {
  let last;
  for (let attempt = 0; attempt < 60; attempt++) {
    const before = journal(dir);
    const shown = await readStatus(page);
    const after = journal(dir);
    const finished = (j) => j.rounds.filter((r) => r.finished).map((r) => r.round);
    last = { before: { devices: Object.keys(before.devices).sort(), finished: finished(before) }, shown };
    if (JSON.stringify(finished(before)) === JSON.stringify(finished(after)) && finished(before).length >= 1
        && JSON.stringify(Object.keys(before.devices).sort()) === JSON.stringify(Object.keys(after.devices).sort())
        && shown.roundsDone === finished(before).length
        && JSON.stringify(shown.doneRows) === JSON.stringify(finished(before))
        && JSON.stringify(Object.keys(shown.devices).sort()) === JSON.stringify(Object.keys(before.devices).sort())) {
      for (const [id, d] of Object.entries(before.devices)) {
        const [, , runtime, role, split] = shown.devices[id];
        assert.equal(runtime, (d.runtimes ?? []).join(", ") || "torch", `${id}'s runtime on the status page`);
        assert.equal(role, d.role, `${id}'s role on the status page`);
        assert.equal(Number(split), d.split, `${id}'s split on the status page`);
      }
      return { journal: before, shown };
    }
    await sleep(250);
  }
  assert.fail(`the status page never showed the journal's state: ${JSON.stringify(last)}`);
}
