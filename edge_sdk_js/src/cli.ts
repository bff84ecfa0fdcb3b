#!/usr/bin/env node
/**
 * A device without Python: `node dist/cli.js --url ws://host:8765 --id board-1 --budget 300MiB --data shard.npz`
 * (docs/js-device.md). Trains on onnxruntime-node, or on onnxruntime-web with `--runtime web`
 * (boards onnxruntime-node has no build for, such as armv7).
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import WebSocket from "ws";
import { DeviceClient } from "./client.js";
import { fileStore } from "./pending-file.js";
import { loadRuntime } from "./runtime.js";
import { loadShard, parseSize } from "./shard.js";
import type { WebSocketLike } from "./transport.js";

const USAGE = `usage: edgetrain-device --url ws://host:8765 --id ID --budget SIZE --data shard.npz|shard.json
  [--runtime node|web] [--token TOKEN | --secret-file FILE] [--threads N] [--device-class NAME]
  [--label KEY=VALUE ...] [--reconnect-retries N] [--pending FILE] [--json-events]
  --pending FILE: keep an unacknowledged update there, so a restarted device finishes its round`;

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      url: { type: "string", default: "ws://127.0.0.1:8765" }, id: { type: "string" }, budget: { type: "string" },
      data: { type: "string" }, runtime: { type: "string", default: "node" }, token: { type: "string", default: "" },
      "secret-file": { type: "string" }, threads: { type: "string", default: "1" }, "device-class": { type: "string", default: "" },
      label: { type: "string", multiple: true, default: [] }, "reconnect-retries": { type: "string", default: "30" },
      pending: { type: "string" },
      "json-events": { type: "boolean", default: false }, help: { type: "boolean", default: false },
    },
  });
  if (values.help || !values.id || !values.budget || !values.data) {
    console.error(USAGE);
    process.exit(values.help ? 0 : 2);
  }
  if (values.runtime !== "node" && values.runtime !== "web") throw new Error(`--runtime must be node or web, not ${values.runtime}`);
  const threads = Number(values.threads);
  const runtime = await loadRuntime(values.runtime, threads);
  const labels = Object.fromEntries(values.label.map((l) => {
    const at = l.indexOf("=");
    if (at < 1) throw new Error(`a label is KEY=VALUE, got ${l}`);
    return [l.slice(0, at), l.slice(at + 1)];
  }));
  const json = values["json-events"];
  const client = new DeviceClient({
    server: values.url, deviceId: values.id, budgetBytes: parseSize(values.budget), runtime, data: loadShard(values.data),
    webSocket: (url, maxMessageBytes) => new WebSocket(url, { maxPayload: maxMessageBytes, perMessageDeflate: false }) as unknown as WebSocketLike,
    token: values.token, secret: values["secret-file"] ? readFileSync(values["secret-file"], "utf8").trim() : "",
    threads, cores: threads, deviceClass: values["device-class"], labels, maxRetries: Number(values["reconnect-retries"]),
    ...(values.pending ? { pending: fileStore(values.pending) } : {}),
    onEvent: (kind, data) => {
      if (json) console.log(JSON.stringify({ event: kind, ...data }));
      else console.error(`${kind}: ${JSON.stringify(data)}`);
    },
  });
  const reports = await client.run();
  if (!json) console.error(`done: ${reports.length} reports`);
}

main().catch((exc: unknown) => {
  console.error(exc instanceof Error ? `${exc.name}: ${exc.message}` : String(exc));
  process.exit(1);
});
