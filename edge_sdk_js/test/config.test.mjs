// The device's --config file: the Python device's TOML keys, parsed without a TOML package; the
// command line wins over the file. (web.test.mjs runs a Node device from such a file.)
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { parseConfig } from "../dist/config.js";
import { HERE } from "./cases.mjs";
import { tempDir } from "./fleet.mjs";

test("config: the Python device's keys and value types; unknown keys and bad lines named", () => {
  const text = `# a board
server = "ws://10.0.0.2:8765"   # the orchestrator
id = 'board-7'
budget = "300MiB"
threads = 2
json_events = true
label = ["site=lab # 3", 'priority=1',]
`;
  assert.deepEqual(parseConfig(text), { server: "ws://10.0.0.2:8765", id: "board-7", budget: "300MiB", threads: "2",
    "json-events": true, label: ["site=lab # 3", "priority=1"] });
  assert.throws(() => parseConfig('id = "a"\nbackend = "torch"\n', "d.toml"), /d\.toml:2: unknown key "backend"/);
  assert.throws(() => parseConfig("[device]\n", "d.toml"), /d\.toml:1: expected key = value/);
  assert.throws(() => parseConfig("id = board\n", "d.toml"), /d\.toml:1: a value is/);
  assert.throws(() => parseConfig("label = [true]\n"), /arrays hold strings/);
});

test("config: the command line wins over the file; what is missing is asked for", () => {
  const dir = tempDir("edgetrain-js-config-");
  const file = join(dir, "device.toml");
  writeFileSync(file, 'server = "ws://127.0.0.1:9"\nid = "board-1"\nbudget = "300MiB"\n');
  const run = (...args) => spawnSync(process.execPath, [join(HERE, "..", "dist", "cli.js"), ...args], { encoding: "utf8" });
  const noData = run("--config", file);
  assert.equal(noData.status, 2);
  assert.match(noData.stderr, /usage: edgetrain-device/);
  const badRuntime = run("--config", file, "--data", "x.npz", "--runtime", "gpu");
  assert.equal(badRuntime.status, 1);
  assert.match(badRuntime.stderr, /--runtime must be node or web, not gpu/);
  writeFileSync(file, 'server = "ws://127.0.0.1:9"\nid = "board-1"\nbudget = "300MiB"\nruntime = "gpu"\n');
  const overridden = run("--config", file, "--runtime", "node", "--data", join(dir, "missing.npz"));
  assert.equal(overridden.status, 1);
  assert.doesNotMatch(overridden.stderr, /--runtime must be/, "--runtime on the command line wins over the file");
  assert.match(overridden.stderr, /missing\.npz/);
  const noFile = run("--config", join(dir, "nope.toml"));
  assert.equal(noFile.status, 1);
  assert.match(noFile.stderr, /nope\.toml/);
});
