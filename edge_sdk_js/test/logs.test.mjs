// The device's progress as a person reads it (src/logs.ts): the Python device's sentences and text
// format (edge_sdk/logs.py), a round's report as one line, the rest as `kind key=value`; JSON lines
// on standard output with --json-events instead.
import assert from "node:assert/strict";
import { test } from "node:test";
import { describe, eventPrinter, logLine } from "../dist/logs.js";

test("events as readable lines: the Python device's sentences, a round's report, the rest as key=value", () => {
  assert.equal(describe("welcome", { device: "b", role: "weak", split: 3, chunks: [[0, 3]] }), "joined as weak at split 3");
  assert.equal(describe("reconnect", { device: "b", server: "ws://h:1", attempt: 2, delay_s: 0.25, error: "ECONNREFUSED" }),
    "server ws://h:1 unreachable (ECONNREFUSED); retry 2 in 0.3 s");
  assert.equal(describe("run_over", { rounds: 5, next_check_s: 30 }), "the run is over after 5 rounds here; looking for the next run in 30.0 s");
  assert.equal(describe("round_done", { device: "b", round: 3, phase: "train", accepted: true, reason: "", role: "moderate",
    trained: [2, 4], runtime: "onnxruntime-node", backend: "onnxruntime-node", loss_before: 1.90213, loss_after: 1.77649,
    download_s: 0.31, forward_s: 0.01, train_s: 2.04, upload_s: 0.12 }),
  "round 3: trained blocks 2-3 (moderate) on onnxruntime-node, loss 1.9021 -> 1.7765, accepted; download 0.3 s, train 2.0 s, upload 0.1 s");
  assert.equal(describe("round_done", { round: 4, phase: "train", accepted: false, reason: "late", role: "weak", trained: [3, 4],
    runtime: "onnxruntime-web" }), "round 4: trained block 3 (weak) on onnxruntime-web, not accepted (late)");
  assert.equal(describe("delta_applied", { device: "b", round: 2, kind: "chunk", bytes: 1234, rebuilt: 4096, base: true }),
    "delta_applied round=2 kind=chunk bytes=1234 rebuilt=4096 base=true");
  assert.equal(describe("stopping", { device: "b", now: false }), "stopping after the round at hand");
  assert.match(logLine("reconnect", { attempt: 1, delay_s: 1 }, new Date(2026, 11, 6, 1, 2, 3)),
    /^2026-12-06 01:02:03 WARNING server .* retry 1 in 1\.0 s$/);
  assert.equal(logLine("welcome", { role: "strong", split: 1 }, new Date(2026, 11, 6, 1, 2, 3)), "2026-12-06 01:02:03 INFO joined as strong at split 1");
});

test("--json-events: one JSON object a line on standard output, nothing readable", () => {
  const out = [], err = [];
  eventPrinter(true, (l) => out.push(l), (l) => err.push(l))("welcome", { device: "b", role: "weak", split: 3 });
  eventPrinter(false, (l) => out.push(l), (l) => err.push(l))("welcome", { device: "b", role: "weak", split: 3 });
  assert.deepEqual(out.map((l) => JSON.parse(l)), [{ event: "welcome", device: "b", role: "weak", split: 3 }]);
  assert.equal(err.length, 1);
  assert.match(err[0], / INFO joined as weak at split 3$/);
});
