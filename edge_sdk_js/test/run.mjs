// Runs the test files of one tier with node's test runner: `node test/run.mjs quick|slow`.
// Every test/*.test.mjs is quick unless SLOW names it (whole fleets, resumes, served pages), so a new
// quick test needs no edit here or in package.json.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

export const SLOW = new Set(["e2e", "resume", "web", "status-login", "mixed-fleet", "phone-lan", "service",
  "wire-codecs", "budgets", "leave", "phases", "device-command", "ticket-page", "secagg-e2e", "secagg-fleet",
  "tab-payloads", "package-install", "install-page", "transformer-splits", "lm-fleet", "buffered-fleet", "secagg-attack"]);
/** The heavy tier (`make test-heavy`, not CI, whose hour the quick and slow tiers fill): the WebGPU tab's
 * numbers against the Python device, on SwiftShader (minutes a split); the
 * secure and the mixed fleets' accuracy against a second fleet's (CI runs each fleet alone, with an accuracy
 * floor); the status page's login over plain http (CI logs in over https, the same flow over TLS). */
export const HEAVY = new Set(["webgpu-conformance", "secagg-fleet-accuracy", "mixed-fleet-accuracy",
  "status-login-http"]);

const tier = process.argv[2] ?? "quick";
if (tier !== "quick" && tier !== "slow" && tier !== "heavy") {
  console.error(`usage: node test/run.mjs quick|slow|heavy (got ${tier})`);
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const files = readdirSync(here).filter((f) => f.endsWith(".test.mjs")).sort()
  .filter((f) => {
    const name = f.slice(0, -".test.mjs".length);
    return (HEAVY.has(name) ? "heavy" : SLOW.has(name) ? "slow" : "quick") === tier;
  })
  .map((f) => join("test", f));
// The devices the tests start keep their payloads by default (payload-cache "auto"): under a folder of
// this run's, removed after it, never in the user's cache.
const payloads = mkdtempSync(join(tmpdir(), "edgetrain-test-payloads-"));
const env = { ...process.env, EDGETRAIN_PAYLOAD_CACHE: payloads };
// test/tmp.mjs in every file's process: a passing test's temporary folders are removed, a failing one's kept.
const cleanup = pathToFileURL(join(here, "tmp.mjs")).href;
// The quick tier runs two files at a time (node's default is one fewer than the cores: one, on 2 cores): most
// of a file's time is spent waiting on the processes it starts (a Python server, a browser, a device); it
// took 246 s one file at a time and 169 s two at a time, on the same loaded machine. The slower tiers run
// one at a time: their fleets hold both cores, and a straggler's grace is measured in wall time.
// $EDGETRAIN_JS_TEST_CONCURRENCY sets it.
const concurrency = process.env.EDGETRAIN_JS_TEST_CONCURRENCY ?? (tier === "quick" ? "2" : "1");
const run = spawnSync(process.execPath, ["--test", `--test-concurrency=${concurrency}`, "--import", cleanup, ...files],
  { stdio: "inherit", cwd: dirname(here), env });
rmSync(payloads, { recursive: true, force: true });
process.exit(run.status ?? 1);
