// A websocket relay on 127.0.0.1 in front of a server, where an outside observer of the network
// would sit: it writes every frame either way to a file and can cut a device's connection at a step
// of a secure round. Used by secagg-attack.test.mjs.
import { closeSync, openSync, writeSync } from "node:fs";
import { decode, encode } from "@msgpack/msgpack";
import WebSocket, { WebSocketServer } from "ws";

const MAX_FRAME = 64 * 2 ** 20;

/** The message type and round of a frame (msgpack: `t`, `round`, ...), or `{}` for one that is not a map. */
function peek(data) {
  try {
    const msg = decode(data);
    return msg !== null && typeof msg === "object" ? msg : {};
  } catch {
    return {};
  }
}

/**
 * A relay to `target` (ws://127.0.0.1:port) recording to `file` a msgpack stream of `[connection,
 * toServer, frame]`, one per frame, in the order the relay passed them on (a connection's frames in
 * their order). `cuts`: `{ device, round, after }`, each done once: the device's connection (both
 * sides) is cut right after the server has its `secagg_keys` or its `secagg_shares` of `round`
 * (`after`: that type), or, for `after: "upload"`, its masked upload of `round` (when the server's
 * `ack` of the train report passes). Resolves `{ url, cut, close }`: `cut` lists the cuts made,
 * `[device, round, after]`, in order.
 */
export async function recordingRelay(target, file, cuts = []) {
  const fd = openSync(file, "w");
  const pending = cuts.map((c) => ({ ...c }));
  const made = [];
  const relay = new WebSocketServer({ host: "127.0.0.1", port: 0, maxPayload: MAX_FRAME, perMessageDeflate: false });
  let connections = 0;
  relay.on("connection", (down, request) => {
    const conn = connections++;
    const headers = request.headers.authorization ? { authorization: request.headers.authorization } : {};
    const up = new WebSocket(target + (request.url ?? "/"), { perMessageDeflate: false, maxPayload: MAX_FRAME, headers });
    const early = [];
    let device = "", cutNow = false;
    const record = (toServer, data) => writeSync(fd, encode([conn, toServer, data]));
    const cut = (c) => {
      cutNow = true;
      pending.splice(pending.indexOf(c), 1);
      made.push([c.device, c.round, c.after]);
      up.close(); // after the frames already sent: the server reads everything the device sent, then the end
      down.terminate();
    };
    const toServer = (data) => {
      if (cutNow) return;
      const msg = peek(data);
      if (msg.t === "hello") device = msg.device_id;
      record(true, data);
      up.send(data);
      const c = pending.find((x) => x.device === device && x.round === msg.round && x.after === msg.t);
      if (c) cut(c);
    };
    up.on("open", () => { for (const data of early.splice(0)) toServer(data); });
    down.on("message", (data) => (up.readyState === WebSocket.OPEN ? toServer(data) : early.push(data)));
    up.on("message", (data) => {
      if (cutNow) return;
      record(false, data);
      const msg = peek(data);
      const c = msg.t === "ack" && msg.phase === "train"
        && pending.find((x) => x.device === device && x.round === msg.round && x.after === "upload");
      if (c) cut(c);
      else down.send(data);
    });
    up.on("close", () => down.close());
    up.on("error", () => down.terminate());
    down.on("close", () => up.close());
    down.on("error", () => up.close());
  });
  await new Promise((resolve) => relay.on("listening", resolve));
  return {
    url: `ws://127.0.0.1:${relay.address().port}`,
    cut: made,
    close: () => new Promise((resolve) => {
      for (const ws of relay.clients) ws.terminate();
      relay.close(() => { closeSync(fd); resolve(); });
    }),
  };
}
