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
import { folderPayloadStore } from "./payload-store-file.js";
import { fileStore } from "./pending-file.js";
import { loadRuntime } from "./runtime.js";
import { readConfig } from "./config.js";
import { loadShard, parseSize } from "./shard.js";
import type { WebSocketLike } from "./transport.js";

const USAGE = `usage: edgetrain-device --server ws://host:8765 --id ID --budget SIZE --data shard.npz|shard.json
  [--config device.toml] [--runtime node|web] [--token TOKEN | --secret-file FILE] [--threads N]
  [--device-class NAME] [--label KEY=VALUE ...] [--reconnect-retries N] [--pending FILE] [--payload-cache DIR]
  [--payload-cache-size SIZE] [--json-events]
  (--url is --server; the config file holds the same settings without their dashes, as the Python device's)
  --pending FILE: keep an unacknowledged update there, so a restarted device finishes its round
  --payload-cache DIR: keep downloaded payloads there by sha256; none held is downloaded again`;

const DEFAULTS = { server: "ws://127.0.0.1:8765", runtime: "node", token: "", threads: "1", "device-class": "",
  label: [] as string[], "reconnect-retries": "30", "json-events": false, "payload-cache-size": "256MiB" };

/** The settings: the command line's, then the config file's, then the defaults. */
function settings() {
  const { values: given } = parseArgs({
    options: {
      config: { type: "string" }, server: { type: "string" }, url: { type: "string" }, id: { type: "string" },
      budget: { type: "string" }, data: { type: "string" }, runtime: { type: "string" }, token: { type: "string" },
      "secret-file": { type: "string" }, threads: { type: "string" }, "device-class": { type: "string" },
      label: { type: "string", multiple: true }, "reconnect-retries": { type: "string" }, pending: { type: "string" },
      "payload-cache": { type: "string" }, "payload-cache-size": { type: "string" }, "json-events": { type: "boolean" }, help: { type: "boolean", default: false },
    },
  });
  const { url, config, ...rest } = given;
  const file = config ? readConfig(config) : {};
  const cli = Object.fromEntries(Object.entries({ ...rest, server: rest.server ?? url }).filter(([, v]) => v !== undefined));
  return { ...DEFAULTS, ...file, ...cli } as typeof DEFAULTS & Record<string, string | boolean | string[] | undefined>;
}

async function main(): Promise<void> {
  const values = settings();
  if (values.help || !values.id || !values.budget || !values.data) {
    console.error(USAGE);
    process.exit(values.help ? 0 : 2);
  }
  if (values.runtime !== "node" && values.runtime !== "web") throw new Error(`--runtime must be node or web, not ${values.runtime}`);
  const threads = Number(values.threads);
  const runtime = await loadRuntime(values.runtime, threads);
  const labels = Object.fromEntries((Array.isArray(values.label) ? values.label : [String(values.label)]).map((l) => {
    const at = l.indexOf("=");
    if (at < 1) throw new Error(`a label is KEY=VALUE, got ${l}`);
    return [l.slice(0, at), l.slice(at + 1)];
  }));
  const json = values["json-events"] === true;
  const client = new DeviceClient({
    server: values.server, deviceId: String(values.id), budgetBytes: parseSize(String(values.budget)), runtime,
    data: loadShard(String(values.data)),
    webSocket: (url, maxMessageBytes) => new WebSocket(url, { maxPayload: maxMessageBytes, perMessageDeflate: false }) as unknown as WebSocketLike,
    token: values.token, secret: values["secret-file"] ? readFileSync(String(values["secret-file"]), "utf8").trim() : "",
    threads, cores: threads, deviceClass: values["device-class"], labels, maxRetries: Number(values["reconnect-retries"]),
    ...(values.pending ? { pending: fileStore(String(values.pending)) } : {}),
    ...(values["payload-cache"]
      ? { payloadStore: folderPayloadStore(String(values["payload-cache"]), parseSize(String(values["payload-cache-size"]))) }
      : {}),
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
