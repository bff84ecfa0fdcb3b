// Runs the test files of one tier with node's test runner: `node test/run.mjs quick|slow`.
// Every test/*.test.mjs is quick unless SLOW names it (whole fleets, resumes, served pages), so a new
// quick test needs no edit here or in package.json.
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const SLOW = new Set(["e2e", "resume", "web", "status-login", "mixed-fleet", "phone-lan", "service", "webgpu-conformance",
  "wire-codecs", "budgets", "leave", "phases", "device-command", "ticket-page", "secagg-e2e", "secagg-fleet",
  "tab-payloads", "package-install", "install-page", "transformer-splits", "lm-fleet"]);

const tier = process.argv[2] ?? "quick";
if (tier !== "quick" && tier !== "slow") {
  console.error(`usage: node test/run.mjs quick|slow (got ${tier})`);
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const files = readdirSync(here).filter((f) => f.endsWith(".test.mjs")).sort()
  .filter((f) => SLOW.has(f.slice(0, -".test.mjs".length)) === (tier === "slow"))
  .map((f) => join("test", f));
const run = spawnSync(process.execPath, ["--test", ...files], { stdio: "inherit", cwd: dirname(here) });
process.exit(run.status ?? 1);
