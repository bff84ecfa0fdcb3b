// The protocol layer against a websocket peer written here: a malformed frame from the server is
// answered with an error frame and a 1008 close, and the device stops (it does not retry);
// messages, tensors and transfers refuse what docs/protocol.md says they refuse.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import WebSocket, { WebSocketServer } from "ws";
import { python, pythonEnv } from "./cases.mjs";
import { BUILTIN_REGISTRY, DeviceClient, DeviceSession, IncomingTransfer, PROBE_STEP_MAX_S, ProtocolError, decode, decodeTensors, encode,
  encodeTensors, frames, loadRuntime, measureProbe, tensor } from "../dist/index.js";

function serverSaying(reply) {
  return new Promise((resolve) => {
    const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });
    const seen = [];
    wss.on("connection", (ws) => {
      ws.on("message", (data) => {
        seen.push(decode(new Uint8Array(data)));
        if (seen.length === 1) ws.send(reply);
      });
      ws.on("close", (code) => seen.push({ closed: code }));
    });
    wss.on("listening", () => resolve({ url: `ws://127.0.0.1:${wss.address().port}`, seen, close: () => wss.close() }));
  });
}

test("a malformed frame from the server gets an error frame and a 1008 close", async () => {
  const peer = await serverSaying(Uint8Array.from([0xc1, 0x00, 0xff]));
  const x = tensor("float32", [2, 2], new Float32Array(4));
  const y = tensor("int64", [2], new BigInt64Array(2));
  const client = new DeviceClient({ server: peer.url, deviceId: "d", budgetBytes: 1 << 30, runtime: await loadRuntime("node"),
    webSocket: (url) => new WebSocket(url), data: { x, y } });
  await assert.rejects(client.run(), (exc) => exc instanceof ProtocolError && exc.code === "malformed");
  await new Promise((r) => setTimeout(r, 200));
  peer.close();
  assert.equal(peer.seen[0].t, "hello");
  assert.deepEqual(peer.seen[0].runtimes, ["onnxruntime-node"]);
  assert.ok(peer.seen[0].probe_step_s > 0 && peer.seen[0].probe_step_s < 1, `${peer.seen[0].probe_step_s}`); // its pace's seed
  assert.equal(peer.seen[1].t, "error");
  assert.equal(peer.seen[1].code, "malformed");
  assert.deepEqual(peer.seen[2], { closed: 1008 });
});

/** A server that answers the hello with a welcome and one instruction of phase `busy`, then says goodbye
 * and closes, as a run's end does while a device trains; `closed` resolves once the device saw the close. */
function serverEndingMidRound() {
  return new Promise((resolve) => {
    const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });
    let hellos = 0, sawClose;
    const closed = new Promise((r) => { sawClose = r; });
    wss.on("connection", (ws) => {
      ws.once("message", () => {
        hellos += 1;
        ws.send(encode({ t: "welcome", device_id: "d", role: "weak", split: 1, num_blocks: 2, chunks: [], model: "m",
          model_version: 0, batch_size: 1, local_steps: 1, config: {} }));
        ws.send(encode({ t: "instruction", round: 1, phase: "busy", model_version: 0, split: 1, chunk_ids: [], model_id: "m",
          selection: "tail", broadcast_id: "", local_steps: 1, lr: 0.1, deadline_s: 0, config: {} }));
        ws.send(encode({ t: "bye", reason: "training finished" }));
        ws.close(1000, "done");
        ws.on("close", () => sawClose());
      });
    });
    wss.on("listening", () => resolve({ url: `ws://127.0.0.1:${wss.address().port}`, closed, hellos: () => hellos,
      close: () => wss.close() }));
  });
}

test("a goodbye that comes while the device is busy ends its run: its next send meets a closed socket, not a drop to retry", async () => {
  const peer = await serverEndingMidRound();
  let release;
  const busy = new Promise((r) => { release = r; });
  const registry = BUILTIN_REGISTRY.extended({ phases: { busy: async () => { await busy; return { metrics: {} }; } } });
  const x = tensor("float32", [2, 2], new Float32Array(4));
  const y = tensor("int64", [2], new BigInt64Array(2));
  const client = new DeviceClient({ server: peer.url, deviceId: "d", budgetBytes: 1 << 30, runtime: await loadRuntime("node"),
    webSocket: (url) => new WebSocket(url), data: { x, y }, registry, reconnect: false });
  const run = client.run();
  await peer.closed;
  await new Promise((r) => setTimeout(r, 50)); // the device's socket has its close too
  release();
  try {
    assert.deepEqual(await run, [], "the run ends with the goodbye (without it: ConnectionLost, or reconnects forever)");
    assert.equal(peer.hellos(), 1, "no second connection");
  } finally {
    peer.close();
  }
});

test("what crosses the device's own goodbye is dropped; what follows the server's is refused", () => {
  const welcomed = () => {
    const s = new DeviceSession();
    s.send({ t: "hello", device_id: "d", token: "", budget_bytes: 1, cores: 1, runtimes: [], num_samples: 1, device_class: "",
      labels: {}, resume_round: -1, rows: {}, ext: {} });
    assert.equal(s.receive({ t: "welcome", device_id: "d", role: "r", split: 1, num_blocks: 3, chunks: [], model: "m",
      model_version: 0, batch_size: 1, local_steps: 1, config: {} }), true);
    return s;
  };
  const instruction = { t: "instruction", round: 0, phase: "train", model_version: 0, split: 1, chunk_ids: [], model_id: "m",
    selection: "tail", broadcast_id: "", local_steps: 1, lr: 0.1, deadline_s: 0, config: {} };
  const leaving = welcomed();
  leaving.send({ t: "bye", reason: "leaving" });
  assert.equal(leaving.receive(instruction), false);  // sent before the server read the bye
  assert.equal(leaving.receive({ t: "bye", reason: "training finished" }), false);
  assert.equal(leaving.state, "CLOSED");
  assert.equal(leaving.instruction, null);
  assert.throws(() => leaving.send({ t: "bye", reason: "again" }), ProtocolError);
  const told = welcomed();
  told.receive({ t: "bye", reason: "training finished" });
  assert.throws(() => told.receive(instruction), /after the session was closed/);
});

test("messages: every field present, none extra, types checked", () => {
  const fetch = { t: "fetch", round: 3, payload_id: "p", offset: 0 };
  assert.deepEqual(decode(encode(fetch)), { ...fetch, held: "" }); // an optional field left out decodes to its default
  const codeOf = (fn) => { try { fn(); } catch (e) { return e.code; } return "ok"; };
  assert.equal(codeOf(() => encode({ ...fetch, round: 1.5 })), "malformed");
  assert.equal(codeOf(() => encode({ ...fetch, payload_id: "" })), "malformed");
  assert.equal(codeOf(() => decode(Uint8Array.from([0x81, 0xa1, 0x74, 0xa3, 0x66, 0x6f, 0x6f]))), "bad_version");
  assert.equal(codeOf(() => encode({ t: "ack", round: 1, accepted: 1, reason: "", phase: "" })), "malformed");
  assert.equal(codeOf(() => encode({ t: "report", round: 1, phase: "train", num_samples: 1, trained: [0, 1], transfer_id: "", metrics: {} })), "malformed");
  // A report echoes its instruction's model_version (buffered rounds weigh it by staleness); -1: not said.
  const report = { t: "report", round: 4, phase: "train", num_samples: 8, trained: [1, 3], transfer_id: "u", metrics: {} };
  assert.deepEqual(decode(encode({ ...report, model_version: 2 })), { ...report, model_version: 2 });
  assert.deepEqual(decode(encode(report)), { ...report, model_version: -1 });
  assert.equal(codeOf(() => encode({ ...report, model_version: -2 })), "malformed");
});

test("hello: the probe step is optional, checked, and measured with the backend's own step", async () => {
  const hello = { t: "hello", device_id: "d", token: "", budget_bytes: 1, cores: 1, runtimes: ["onnxruntime"], num_samples: 1,
    device_class: "", labels: {}, resume_round: -1, rows: {}, ext: {} };
  assert.deepEqual(decode(encode(hello)), { ...hello, input_shape: [], num_classes: -1, probe_step_s: 0 }); // an old device: none
  assert.deepEqual(decode(encode({ ...hello, probe_step_s: 0.25 })).probe_step_s, 0.25);
  const codeOf = (fn) => { try { fn(); } catch (e) { return e.code; } return "ok"; };
  assert.equal(codeOf(() => encode({ ...hello, probe_step_s: PROBE_STEP_MAX_S + 1 })), "malformed");
  assert.equal(codeOf(() => encode({ ...hello, probe_step_s: -0.5 })), "malformed");
  assert.equal(codeOf(() => encode({ ...hello, probe_step_s: Infinity })), "non_finite");
  // The Python SDK (the server's side) reads both hellos: the probe, and none from an old device.
  const hexes = [encode({ ...hello, probe_step_s: 0.25 }), encode(hello)].map((b) => Buffer.from(b).toString("hex"));
  const script = "import sys\nfrom edge_sdk import protocol as p\nprint(*(p.decode(bytes.fromhex(h)).probe_step_s for h in sys.argv[1:]))";
  assert.equal(execFileSync(python(), ["-c", script, ...hexes], { env: pythonEnv(), encoding: "utf8" }).trim(), "0.25 0.0");
  const plain = await measureProbe({ name: "plain", runtimes: [], needsGraph: false, check() {}, async prepare() { throw new Error(); } });
  assert.ok(plain > 0 && plain < 1, `${plain}`);
  let stepped = 0;
  const slow = await measureProbe({ name: "slow", runtimes: [], needsGraph: false, check() {}, async prepare() { throw new Error(); },
    async probeStep() { stepped += 1; await new Promise((r) => setTimeout(r, 200)); } });
  assert.equal(stepped, 1);
  assert.ok(slow >= 0.19, `${slow}`);
});

test("tensors: round trip, and NaN, bad shapes and unknown dtypes refused", () => {
  const w = tensor("float32", [2, 3], Float32Array.from([1, 2, 3, 4, 5, 6]));
  const back = decodeTensors(encodeTensors({ w, i: tensor("int64", [1], BigInt64Array.of(7n)) }));
  assert.deepEqual([...back.w.data], [1, 2, 3, 4, 5, 6]);
  assert.deepEqual(back.w.shape, [2, 3]);
  assert.equal(back.i.data[0], 7n);
  const codeOf = (fn) => { try { fn(); } catch (e) { return e.code; } return "ok"; };
  assert.equal(codeOf(() => decodeTensors(encodeTensors({ w: tensor("float32", [1], Float32Array.of(NaN)) }))), "non_finite");
  const bytes = encodeTensors({ w });
  const badDtype = bytes.slice();
  badDtype[1 + 2 + 6] = 99; // after the fixmap, the key "w" and the ext 32 header: the dtype code
  assert.equal(codeOf(() => decodeTensors(badDtype)), "bad_dtype");
  const badShape = bytes.slice();
  badShape[1 + 2 + 6 + 8] = 4; // first dimension 4 instead of 2: the data is too short
  assert.equal(codeOf(() => decodeTensors(badShape)), "bad_shape");
  assert.equal(codeOf(() => decodeTensors(bytes.subarray(0, bytes.length - 4))), "malformed");
});

test("transfers: frames checked and hashed as they land; a resumed transfer continues", () => {
  const payload = Uint8Array.from({ length: 1000 }, (_, i) => i % 251);
  const msgs = [...frames(payload, { transferId: "t", kind: "update", meta: {}, frameSize: 300 })];
  const incoming = new IncomingTransfer(msgs[0]);
  incoming.feed(msgs[1]);
  assert.throws(() => incoming.feed(msgs[3]), (e) => e.code === "out_of_order");
  const resumed = [...frames(payload, { transferId: "t", kind: "update", meta: {}, frameSize: 300, offset: 300 })];
  assert.throws(() => incoming.resume({ ...resumed[0], offset: 0 }), (e) => e.code === "out_of_order");
  incoming.resume({ ...resumed[0], sha256: "" });
  for (const m of resumed.slice(1, -1)) incoming.feed(m);
  incoming.finish(resumed.at(-1));
  assert.deepEqual(incoming.result(), payload);
  const corrupt = new IncomingTransfer(msgs[0]);
  for (const m of msgs.slice(1, -1)) corrupt.feed({ ...m, data: m.data.map((b) => b ^ 1) });
  corrupt.finish(msgs.at(-1));
  assert.throws(() => corrupt.result(), (e) => e.code === "checksum");
});

