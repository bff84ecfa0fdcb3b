import { startServer, tempDir, journal } from "./fleet.mjs";
import { launchBrowser } from "./status-page.mjs";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const dir = tempDir("try-");
const { server, url } = await startServer(dir, ["--web", "--model", "digits_mlp", "--rounds", "4", "--min-devices", "1",
  "--local-steps", "5", "--deadline", "150"]);
const site = url.replace("ws://", "http://");
const browser = await launchBrowser();
try {
  let tab = await browser.newPage(); tab.on("pageerror", (e) => console.log("PAGEERR", e.message)); tab.on("console", (m) => console.log("CONSOLE", m.text()));
  await tab.setViewport({ width: 390, height: 844 });
  await tab.goto(`${site}/?id=tab-t&autostart=1`);
  for (let i = 0; i < 40; i++) { await sleep(5000); console.log(await tab.evaluate(() => document.getElementById("budget-source").textContent)); const st = await tab.evaluate(() => ({ s: window.edgetrain?.state, r: window.edgetrain?.rounds, e: window.edgetrain?.error, b: document.getElementById("budget").value, ev: window.edgetrain?.events.map((e) => e.event).join(",") })); console.log(JSON.stringify(st)); if (st.r >= 1) break; }
  console.log(JSON.stringify(await tab.evaluate(() => ({ b: document.getElementById("budget").value, src: window.edgetrain.budgetSource, iso: crossOriginIsolated, vis: document.visibilityState, sw: !!navigator.serviceWorker.controller }))));
  const other = await browser.newPage(); await other.goto("about:blank"); await other.bringToFront();
  await sleep(3000);
  console.log(JSON.stringify(await tab.evaluate(() => ({ vis: document.visibilityState, state: window.edgetrain.state, paused: window.edgetrain.paused }))));
  await tab.bringToFront();
  await tab.waitForFunction(() => ["finished", "stopped"].includes(window.edgetrain.state), { timeout: 300000, polling: 500 });
  console.log(JSON.stringify(await tab.evaluate(() => ({ state: window.edgetrain.state, rounds: window.edgetrain.rounds, ev: window.edgetrain.events.map((e) => e.event + (e.round ?? "")).join(",") }))));
  await tab.screenshot({ path: "/tmp/dp/page.png", fullPage: true });
} finally { server.kill(); await browser.close(); console.log(dir); }
