// The Node device's command as a person meets it: its data from a CSV table, its hello declaring
// the data so that a real orchestrator refuses a device whose samples the model cannot take before
// sending it anything, and one line and the Python device's exit status for each problem (2 a bad
// setting or data source, 3 a refusal, 1 a server lost for good).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { decode, encode } from "../dist/messages.js";
import { readLocalData } from "../dist/data-file.js";
import { loadShard } from "../dist/shard.js";
import { HERE } from "./cases.mjs";
import { freePort, journal, start, startServer, tempDir, writeShards } from "./fleet.mjs";

const CLI = join(HERE, "..", "dist", "cli.js");
/** The readable line of a retry (src/logs.ts): `2026-12-06 01:02:03 WARNING server ws://... unreachable (...); retry 1 in 0.1 s`. */
const RETRY = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d WARNING server \S+ unreachable \(.*\); retry (\d+) in ([\d.]+) s$/;

/** A digits shard as a CSV table with a header, its label in the first column `digit`; `features` keeps the first ones. */
function csvShard(npz, path, features = 64) {
  const { x, y } = loadShard(npz);
  const width = x.shape[1];
  const rows = Array.from(y.data, (label, i) => [String(label), ...Array.from(x.data.subarray(i * width, i * width + features), String)].join(","));
  writeFileSync(path, [["digit", ...Array.from({ length: features }, (_, j) => `px${j}`)].join(","), ...rows].join("\n") + "\n");
  return path;
}

function lines(file) {
  return readFileSync(file, "utf8").split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

test("hello: the declared data and the probe step are optional fields, left out at their defaults as the Python codec does", () => {
  const hello = { t: "hello", device_id: "d", token: "", budget_bytes: 1, cores: 1, runtimes: [], num_samples: 3, device_class: "",
    labels: {}, resume_round: -1, rows: {}, ext: {} };
  assert.deepEqual(decode(encode({ ...hello, input_shape: [1, 28, 28], num_classes: 10 })),
    { ...hello, input_shape: [1, 28, 28], num_classes: 10, probe_step_s: 0 });
  const bare = encode(hello);
  assert.deepEqual(decode(bare), { ...hello, input_shape: [], num_classes: -1, probe_step_s: 0 });
  assert.deepEqual(encode({ ...hello, input_shape: [], num_classes: -1, probe_step_s: 0 }), bare);
  assert.throws(() => encode({ ...hello, input_shape: [0] }), /input_shape/);
});

test("a CSV table as the Python device reads it: header, label column by name or index, classes or a target", () => {
  const dir = tempDir("edgetrain-js-csv-");
  const file = join(dir, "t.csv");
  writeFileSync(file, "a,b,label\n0.5,1,2\n1.5,2,0\n\n2.5,3,1\n");
  const byName = readLocalData(file, "label");
  assert.deepEqual(byName.x.shape, [3, 2]);
  assert.deepEqual([...byName.y.data], [2n, 0n, 1n]);
  assert.deepEqual([...readLocalData(file, "0").y.data], [0.5, 1.5, 2.5], "fractional labels are a regression target");
  assert.deepEqual([...readLocalData(file).x.data], [0.5, 1, 1.5, 2, 2.5, 3]);
  assert.throws(() => readLocalData(file, "kind"), /--data: .*t\.csv has no column named 'kind' \(columns: a, b, label\)/);
  assert.throws(() => readLocalData(file, "5"), /label column 5 outside its 3 columns/);
  writeFileSync(file, "1,2\n3,x\n");
  assert.throws(() => readLocalData(file), /every cell but the header must be a number \(line 2, column 2: 'x'\)/);
});

test("a device whose data the model cannot take is refused at its hello and downloads nothing; a CSV device trains",
  { timeout: 240_000 }, async () => {
    const dir = tempDir("edgetrain-js-refused-");
    const npz = writeShards(dir, [0], 2)[0];
    const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "1", "--min-devices", "1",
      "--local-steps", "2", "--deadline", "90"]);
    const device = (id, csv, json = true) => start(dir, id, process.execPath, [CLI, "--server", url, "--id", id, "--budget", "400MiB",
      "--data", csv, "--label-column", "digit", ...(json ? ["--json-events"] : []), "--once"], process.env);
    try {
      const narrow = device("narrow", csvShard(npz, join(dir, "narrow.csv"), 32));
      assert.equal(await narrow.done, 3, "a refusal exits with 3");
      const said = readFileSync(join(dir, "narrow.log"), "utf8").trim().split("\n");
      const errors = said.filter((l) => l.startsWith("error: "));
      assert.equal(errors.length, 1, said.join("\n"));
      assert.match(errors[0], /^error: the server refused this device: refused: model digits_mlp takes samples of shape \(64,\) and 10 classes, but this device's data has samples of shape \(32,\)/);
      assert.ok(!lines(join(dir, "narrow.log")).some((e) => e.event === "welcome"), "no welcome");

      const full = device("csv-1", csvShard(npz, join(dir, "full.csv")), false);
      assert.equal(await full.done, 0, `the CSV device trains its round (log in ${dir})`);
      // Without --json-events, its progress is readable lines (src/logs.ts), the Python device's text format.
      const progress = readFileSync(join(dir, "csv-1.log"), "utf8").trim().split("\n");
      assert.deepEqual(progress.filter((l) => l.startsWith("{")), [], "no JSON lines");
      const stamp = "\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d INFO";
      for (const want of [`^${stamp} joined as strong at split \\d$`, `^${stamp} round 1: trained blocks? [\\d-]+ \\(strong\\) on `
        + "onnxruntime-node, loss \\d+\\.\\d{4} -> \\d+\\.\\d{4}, accepted(; \\w+ [\\d.]+ s(, \\w+ [\\d.]+ s)*)?$", `^${stamp} stopped$`]) {
        assert.ok(progress.some((l) => new RegExp(want).test(l)), `a line /${want}/ in:\n${progress.join("\n")}`);
      }
      assert.equal(await server.done, 0);
    } finally {
      if (server.exitCode === null) server.kill();
    }
    const served = lines(join(dir, "server.log"));
    assert.ok(served.some((e) => e.event === "closed" && e.device === "narrow" && e.code === "refused"), "the server logged the refusal");
    assert.ok(!served.some((e) => e.device === "narrow" && e.event !== "closed"), "nothing was sent to the refused device, no fetch");
    assert.ok(served.some((e) => e.event === "sent" && e.device === "csv-1"), "the CSV device fetched its payloads");
    const j = journal(dir);
    assert.deepEqual(Object.keys(j.devices), ["csv-1"], "the refused device was never registered");
    assert.equal(j.reports.filter((r) => r.device === "csv-1" && r.accepted === 1).length, 1);
  });

test("errors are one line with the Python device's exit status", { timeout: 120_000 }, async () => {
  const dir = tempDir("edgetrain-js-errors-");
  const shard = writeShards(dir, [0], 2)[0];
  writeFileSync(join(dir, "zip.npz"), "digit,a\n1,2\n");
  writeFileSync(join(dir, "words.csv"), "a,b\n1,two\n");
  const port = await freePort(); // nothing listens there
  const base = ["--server", `ws://127.0.0.1:${port}`, "--id", "d", "--budget", "300MiB", "--data", shard];
  const cases = [
    [[...base, "--reconnect-retries", "2", "--reconnect-max-delay", "0.2"], 1, /^error: d: lost the server ws:\/\/127\.0\.0\.1:\d+ after 2 retries: .*\(--debug shows the stack\)$/],
    [[...base, "--server", "localhost:8765"], 2, /^error: --server: 'localhost:8765' is not a websocket URL/],
    [[...base, "--data", join(dir, "zip.npz")], 2, /^error: --data: .*zip\.npz: not a zip archive$/],
    [[...base, "--data", join(dir, "words.csv")], 2, /^error: --data: .*words\.csv: every cell but the header must be a number/],
    [[...base, "--data", join(dir, "none.npz")], 2, /^error: --data: no data file at /],
    [[...base, "--data", "digits"], 2, /^error: --data: 'digits' is not a \.npz\/\.json\/\.csv\/\.npy\/\.txt file/],
    [[...base, "--secret-file", join(dir, "none.secret")], 2, /^error: --secret-file: cannot read .*: No such file or directory$/],
    [[...base, "--label", "priority"], 2, /^error: --label: expected KEY=VALUE, got 'priority'$/],
    [[...base, "--backend", "torch"], 2, /^error: --backend: a setting of the python device only; this device does not take it/],
  ];
  for (const [args, status, message] of cases) {
    const out = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 60_000 });
    const said = out.stderr.trim().split("\n").filter((l) => !RETRY.test(l));
    assert.equal(out.status, status, `${args.join(" ")}: ${out.stderr}`);
    assert.equal(said.length, 1, out.stderr);
    assert.match(said[0], message);
  }
  const retries = spawnSync(process.execPath, [CLI, ...cases[0][0]], { encoding: "utf8" }).stderr.split("\n").filter((l) => RETRY.test(l));
  assert.equal(retries.length, 2, "one readable line per attempt");
  for (const line of retries) assert.ok(Number(RETRY.exec(line)[2]) <= 0.2, line);
});

test("install-service writes a systemd unit that runs the Node device from its config file", () => {
  const dir = tempDir("edgetrain-js-unit-");
  const config = join(dir, "device.toml");
  writeFileSync(config, 'server = "ws://10.0.0.2:8765"\nid = "board-7"\nbudget = "300MiB"\ndata = "/var/lib/edgetrain/samples.csv"\n');
  const unit = join(dir, "edgetrain-device.service");
  const out = spawnSync(process.execPath, [CLI, "install-service", "--config", config, "--user", "edgetrain", "-o", unit], { encoding: "utf8" });
  assert.equal(out.status, 0, out.stderr);
  const fields = Object.fromEntries(readFileSync(unit, "utf8").split("\n").filter((l) => l.includes("=") && !l.startsWith("#"))
    .map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]));
  assert.equal(fields.User, "edgetrain");
  assert.equal(fields.ExecStart, `${process.execPath} ${CLI} --config ${config}`);
  assert.equal(fields.Restart, "on-failure");
  assert.equal(fields.RestartPreventExitStatus, "2 3", "a bad config or a refusal is not restarted");
  assert.match(fields.After, /network-online\.target/);
  const analyze = spawnSync("systemd-analyze", ["verify", unit], { encoding: "utf8" });
  if (analyze.error === undefined) assert.equal(analyze.status, 0, analyze.stderr);
  const root = spawnSync(process.execPath, [CLI, "install-service", "--config", config, "--user", "root"], { encoding: "utf8" });
  assert.equal(root.status, 2);
  assert.equal(root.stderr.trim(), "error: --user: a device runs as an unprivileged user, not root");
});
