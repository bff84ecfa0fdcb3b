// The status page's credential login in a real browser (docs/web.md, "Access"): a server run with
// --require-credentials, the status page open in headless Chromium. The page asks for an enrolled
// device's id and credential; a wrong credential shows the server's refusal and no status; the
// right one shows the status with the devices that joined. The page sends proofs only, never the
// secret. The same over https (--tls-cert, the self-signed certificate of tests/data, which the
// browser is told to trust by its key's hash), where devices connect at wss://. The https run is CI's
// (test/status-login.test.mjs: the same login, over TLS); the plain http one the heavy tier's
// (test/status-login-http.test.mjs).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash, X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { CHROMIUM } from "./browser.mjs";
import { REPO, python, pythonEnv } from "./cases.mjs";
import { nodeDevice, startServer, tempDir, writeShards } from "./fleet.mjs";
import { launchBrowser } from "./status-page.mjs";

const CERT = join(REPO, "tests", "data", "localhost-cert.pem");
const KEY = join(REPO, "tests", "data", "localhost-key.pem");
export const SKIP = CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)";

/** `edgetrain device enroll`: the device's secret (the store keeps only its key). */
function enroll(dir, id) {
  const out = join(dir, `${id}.secret`);
  execFileSync(python(), ["-m", "edgetrain", "device", "enroll", "--store", join(dir, "store"), "--id", id, "--out", out],
    { env: pythonEnv(), stdio: ["ignore", "ignore", "pipe"] });
  return { id, secret: readFileSync(out, "utf8").trim(), file: out };
}

/** Chromium trusting exactly this certificate, as a person who accepted it would (its public key's SHA-256). */
function trusting(certFile) {
  const spki = new X509Certificate(readFileSync(certFile)).publicKey.export({ type: "spki", format: "der" });
  return [`--ignore-certificate-errors-spki-list=${createHash("sha256").update(spki).digest("base64")}`];
}

/** What the page shows: the login form (and why), or the status with its device rows. */
function shown(page) {
  return page.evaluate(() => ({
    login: !document.getElementById("login").hidden, why: document.getElementById("login-why").textContent,
    secretLabel: document.getElementById("login-secret-label").textContent,
    idAsked: !document.getElementById("login-id-row").hidden, status: !document.getElementById("status").hidden,
    devices: [...document.querySelectorAll("#devices tr")].map((tr) => tr.dataset.device).sort(),
  }));
}

async function logIn(page, id, secret) {
  await page.$eval("#login-id", (el) => { el.value = ""; });
  await page.$eval("#login-secret", (el) => { el.value = ""; });
  await page.type("#login-id", id);
  await page.type("#login-secret", secret);
  await page.click("#login button[type=submit]");
}

/** The login flow against a server over https (`tls`) or plain http. */
export async function loginFlow(tls) {
  const dir = tempDir(`edgetrain-js-login-${tls ? "https" : "http"}-`);
  const viewer = enroll(dir, "viewer-1");
  const board = enroll(dir, "node-1");
  const shards = writeShards(dir, [1], 2);
  const { server, url: plain } = await startServer(dir, ["--web", "--require-credentials", "--model", "digits_mlp",
    "--rounds", "1", "--min-devices", "1", "--local-steps", "1", "--deadline", "120",
    ...(tls ? ["--tls-cert", CERT, "--tls-key", KEY] : [])]);
  const url = tls ? plain.replace("ws://", "wss://") : plain;
  const site = url.replace(/^ws/, "http");
  const browser = await launchBrowser(tls ? trusting(CERT) : []);
  let device;
  try {
    const page = await browser.newPage();
    const sent = []; // every Authorization header and URL the page sent
    page.on("request", (r) => sent.push(`${r.url()} ${r.headers().authorization ?? ""}`));
    await page.goto(`${site}/status`);
    await page.waitForFunction(() => !document.getElementById("login").hidden, { timeout: 30_000 });
    const asked = await shown(page);
    assert.equal(asked.idAsked, true, "the page asks for a device id");
    assert.equal(asked.secretLabel, "Credential");
    assert.equal(asked.status, false);

    // A wrong credential: the server's refusal on the page, no status.
    await logIn(page, viewer.id, "not-the-secret");
    await page.waitForFunction((before) => document.getElementById("login-why").textContent !== before,
      { timeout: 30_000 }, asked.why);
    const refused = await shown(page);
    assert.equal(refused.login, true);
    assert.equal(refused.status, false, "no status behind a wrong credential");
    assert.match(refused.why, /\S/, "the page says why");
    console.log(`# ${site}: a wrong credential shows "${refused.why}"`);

    // The right one: the status, and the device that joins appears in it.
    await logIn(page, viewer.id, viewer.secret);
    await page.waitForFunction(() => !document.getElementById("status").hidden, { timeout: 30_000 });
    device = nodeDevice(dir, url, board.id, "185MiB", shards[1], "node", ["--secret-file", board.file],
      tls ? { NODE_EXTRA_CA_CERTS: CERT } : {});
    await page.waitForFunction(() => document.querySelector('#devices tr[data-device="node-1"]') !== null,
      { timeout: 120_000, polling: 500 });
    const status = await shown(page);
    assert.equal(status.login, false);
    assert.deepEqual(status.devices, ["node-1"]);
    assert.equal(await page.evaluate(() => location.protocol), tls ? "https:" : "http:");
    assert.ok(sent.some((s) => s.includes("/status.json Edgetrain viewer-1 ")), "the page sent proofs");
    assert.ok(!sent.some((s) => s.includes(viewer.secret)), "the page never sent the secret");
    assert.equal(await device.done, 0, `the device finished its round (logs in ${dir})`);
    assert.equal(await server.done, 0);
  } finally {
    for (const p of [server, device]) if (p && p.exitCode === null) p.kill();
    await browser.close();
  }
}
