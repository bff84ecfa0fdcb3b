// The door (docs/security.md, "The door"): the Node device proves itself in the websocket upgrade
// request's Authorization header, as the Python device does: `Bearer <token>`, or with a secret
// `Edgetrain <id> <proof>`, a fresh proof other than its hello's. A real ws server on loopback
// records what the device sends.
import assert from "node:assert/strict";
import { test } from "node:test";
import WebSocket, { WebSocketServer } from "ws";
import { DeviceClient, loadRuntime, tensor } from "../dist/index.js";

async function headerAndHello(extra) {
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise((resolve) => wss.on("listening", resolve));
  const seen = new Promise((resolve) => wss.on("connection", (ws, request) => {
    ws.on("message", (data) => { resolve({ authorization: request.headers.authorization, hello: data }); ws.terminate(); });
  }));
  const x = tensor("float32", [2, 4], new Float32Array(8));
  const y = tensor("int64", [2], new BigInt64Array(2));
  const client = new DeviceClient({ server: `ws://127.0.0.1:${wss.address().port}`, deviceId: "dev-0", budgetBytes: 1 << 30,
    runtime: await loadRuntime("node"), data: { x, y }, maxRetries: 0,
    webSocket: (u, maxPayload, headers) => new WebSocket(u, { maxPayload, perMessageDeflate: false, headers }), ...extra });
  const run = client.run().catch(() => undefined);
  const got = await seen;
  await run;
  wss.close();
  return got;
}

test("door: the device sends its token or a fresh credential proof in the upgrade request", { timeout: 60_000 }, async () => {
  assert.equal((await headerAndHello({ token: "s3cret" })).authorization, "Bearer s3cret");
  const { authorization, hello } = await headerAndHello({ secret: "the-secret" });
  assert.match(authorization, /^Edgetrain dev-0 hmac2:upgrade:\d+:[0-9a-f]{32}:[0-9a-f]{64}$/);
  const proof = authorization.split(" ")[2];
  assert.ok(Buffer.from(hello).includes(Buffer.from("hmac2:hello:")), "the hello carries a proof made for the hello");
  assert.ok(!Buffer.from(hello).includes(Buffer.from(proof)), "the hello carries another proof than the header");
  assert.equal((await headerAndHello({})).authorization, undefined);
});
