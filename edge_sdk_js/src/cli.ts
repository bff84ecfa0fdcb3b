#!/usr/bin/env node
/**
 * `edgetrain-device` (`node dist/cli.js`): a device without Python, from a one-off run to a service
 * on a board, as `python -m edge_sdk` is (docs/js-device.md). Its options and config-file keys are
 * the shared key table's that this device honours (src/settings.ts); `--print-settings` prints the
 * settings resolved, as the Python device prints them, and exits. The device keeps running
 * (reconnecting with backoff, waiting for the next run) unless `once`; `install-service` writes its
 * systemd unit. Trains on onnxruntime-node, or on onnxruntime-web with `--runtime web` (boards
 * onnxruntime-node has no build for, such as armv7).
 *
 * Errors print one line and exit as the Python device's do: 2 for a bad option, config file or data
 * source, 3 when the server refuses the device, 1 for the rest (a server lost for good, an internal
 * error; `--debug` adds the stack), 130 when interrupted.
 */
import { readFileSync } from "node:fs";
import { availableParallelism, cpus, freemem } from "node:os";
import { parseArgs, type ParseArgsConfig } from "node:util";
import { DeviceClient } from "./client.js";
import { declaredData } from "./data.js";
import { readConfig, strerror } from "./config.js";
import { DeviceRefused, MissingPackages, UsageError } from "./errors.js";
import { readLocalData } from "./data-file.js";
import { folderPayloadStore, payloadFolder } from "./payload-store-file.js";
import { fileStore } from "./pending-file.js";
import { pyRepr } from "./pyformat.js";
import type { EventSink } from "./roundwork.js";
import { importPeers, loadRuntime, RUNTIME_PACKAGES } from "./load-runtime.js";
import { eventPrinter, logLine } from "./logs.js";
import { runService } from "./service.js";
import { resolveSettings, settingRow, settingRows, settingsJson, THIS_SDK, type Settings } from "./settings.js";
import { installService } from "./systemd.js";
import type { WebSocketLike } from "./transport.js";
import type WebSocket from "ws";

const EXIT_USAGE = 2;
const EXIT_REFUSED = 3;
const PROG = "edgetrain-device";

/** The command line's options: the table's keys this device honours, and the command's own. */
function options(): NonNullable<ParseArgsConfig["options"]> {
  const out: NonNullable<ParseArgsConfig["options"]> = {
    config: { type: "string" }, "print-settings": { type: "boolean" }, help: { type: "boolean", short: "h" },
    url: { type: "string" }, // the server's older name
  };
  for (const r of settingRows(THIS_SDK)) out[r.key] = r.type === "bool" ? { type: "boolean" } : { type: "string", multiple: r.type === "list" };
  return out;
}

function usage(): string {
  const lines = settingRows(THIS_SDK).map((r) => {
    const shown = r.default === null || r.default === "" || r.default === false || Array.isArray(r.default) ? "" : ` (default: ${r.default})`;
    return `  --${r.key}${r.type === "bool" ? "" : ` ${r.choices.length ? r.choices.join("|") : r.type.toUpperCase()}`}\n      ${r.help}${shown}`;
  });
  return [`usage: ${PROG} [--config FILE] [--print-settings] [OPTIONS]`, `       ${PROG} install-service --config FILE [--user USER] [-o FILE]`,
    "Run a device: say hello to the server, train its share each round, reconnect when the connection drops,",
    "and wait for the next run when one ends.",
    "  --config FILE\n      TOML file of settings: every option below without its dashes (the Python device's file works too)",
    "  --print-settings\n      print the resolved settings as one JSON object (keyed by the config file's keys) and exit", ...lines].join("\n");
}

/** The command line's values by key (undefined: not given), `--config` and `--print-settings`; null after `--help`. */
function parse(argv: string[]): { given: Record<string, unknown>; config?: string; print: boolean } | null {
  const known = options();
  // `--reconnect-retries -1`: a negative number is the option's value, as the Python device reads it.
  const args = argv.flatMap((a, i) => known[a.slice(2)]?.type === "string" && a.startsWith("--") && /^-\d/.test(argv[i + 1] ?? "")
    ? [] : i > 0 && /^-\d/.test(a) && known[argv[i - 1]!.slice(2)]?.type === "string" ? [`${argv[i - 1]}=${a}`] : [a]);
  let values: Record<string, unknown>;
  try {
    ({ values } = parseArgs({ args, options: known, strict: true, allowPositionals: false }));
  } catch (exc) {
    const other = /^Unknown option '--([^']+)'/.exec((exc as Error).message)?.[1];
    const row = other === undefined ? undefined : settingRow(other);
    throw new UsageError(row ? `--${other}: a setting of the ${row.sdks.join(" and ")} device only; this device does not take it (see ${PROG} --help)`
      : `${(exc as Error).message.replace(/\s*\n\s*/g, " ")} (see ${PROG} --help)`);
  }
  if (values["help"]) return null;
  const { config, "print-settings": print, help: _, url, ...given } = values;
  given["server"] ??= url;
  return { given, config: config as string | undefined, print: print === true };
}

/** KEY=VALUE pairs of `option`. */
function pairs(items: string[], option: string): Record<string, string> {
  return Object.fromEntries(items.map((text) => {
    const at = text.indexOf("=");
    if (at < 0 || text.slice(0, at).trim() === "") throw new UsageError(`${option}: expected KEY=VALUE, got ${pyRepr(text)}`);
    return [text.slice(0, at).trim(), text.slice(at + 1).trim()];
  }));
}

/** A file's text for `option`, a `UsageError` naming it when it cannot be read. */
function readFor(option: string, path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (exc) {
    throw new UsageError(`${option}: cannot read ${path}: ${strerror(exc)}`);
  }
}

/** The credential in `--secret-file` ("" without one). */
function readSecret(path: string): string {
  if (!path) return "";
  const secret = readFor("--secret-file", path).trim();
  if (!secret) throw new UsageError(`--secret-file: ${path} holds no credential`);
  return secret;
}

/** What this machine offers when no budget is given: its available memory, within its cgroup's limit (Node's view). */
function machineBudget(): number {
  return typeof process.availableMemory === "function" ? process.availableMemory() : freemem();
}

/** The cores this process may run on, declared in the hello when `cores` is not given (the Python device's `usable_cores`). */
function machineCores(): number {
  return typeof availableParallelism === "function" ? availableParallelism() : Math.max(1, cpus().length);
}

/** Clients as the settings describe them, one per run; what cannot work (data, secret, labels) fails here, before any connection. */
async function clients(s: Settings, onEvent: EventSink): Promise<() => DeviceClient> {
  const labels = pairs(s["label"] as string[], "--label");
  const secret = readSecret(s["secret-file"] as string);
  const ca = s["tls-ca"] ? readFor("--tls-ca", s["tls-ca"] as string) : undefined;
  const data = () => readLocalData(s["data"] as string, s["label-column"] as string,
    { vocabulary: s["vocabulary"] as string, context: s["text-context"] as number, stride: s["text-stride"] as number });
  const first = [data()];
  const threads = s["threads"] as number;
  const kind = s["runtime"] as "node" | "web";
  // ws and the runtime are optional peers (a page's install has neither): both named at once when missing.
  const [{ default: WebSocketClass }] = await importPeers(["ws", RUNTIME_PACKAGES[kind]]) as [{ default: typeof WebSocket }];
  const runtime = await loadRuntime(kind, threads);
  const webSocket = (url: string, maxPayload: number, headers?: Record<string, string>) =>
    withRefusalReason(new WebSocketClass(url, { maxPayload, perMessageDeflate: false, headers, ...(ca ? { ca } : {}) })) as unknown as WebSocketLike;
  const held = payloadFolder(s["payload-cache"] as string, s["server"] as string, s["id"] as string);
  return () => {
    const local = first.pop() ?? data(); // read again for each run: samples that arrived since train in the next
    return new DeviceClient({
      server: s["server"] as string, deviceId: s["id"] as string, budgetBytes: (s["budget"] as number | null) ?? machineBudget(),
      runtime, webSocket, data: local, numClasses: declaredData(local).num_classes, token: s["token"] as string, secret,
      threads, cores: (s["cores"] as number | null) ?? machineCores(), deviceClass: s["device-class"] as string, labels, maxRetries: s["reconnect-retries"] as number,
      maxBackoffS: s["reconnect-max-delay"] as number, secureMinSurvivors: s["secure-min-survivors"] as number, ...(s["pending"] ? { pending: fileStore(s["pending"] as string) } : {}), onEvent,
      ...(held !== undefined ? { payloadStore: folderPayloadStore(held, s["payload-cache-size"] as number) } : {}),
    });
  };
}

/** Run the device the settings describe: a service, or one run with `once`. */
async function runDevice(s: Settings): Promise<void> {
  const onEvent = eventPrinter(s["json-events"] === true);
  await runService(await clients(s, onEvent), { once: s["once"] === true, maxDelayS: s["reconnect-max-delay"] as number, onEvent });
  if (s["json-events"] !== true) console.error(logLine("stopped", {}));
}

async function device(argv: string[]): Promise<number> {
  const parsed = parse(argv);
  if (parsed === null) {
    console.log(usage());
    return 0;
  }
  const settings = resolveSettings(parsed.given, parsed.config === undefined ? null : readConfig(parsed.config));
  if (parsed.print) {
    console.log(settingsJson(settings));
    return 0;
  }
  await runDevice(settings);
  return 0;
}

/** One line on standard error and the exit status for what ended the device. */
/**
 * A handshake answered with another status than 101 fails with the status and the server's one-line reason (its body,
 * at most 1 KiB): "Unexpected server response: 401: credential proof is +300 s from the server's clock", which
 * `doorRefusal` (transport.ts) takes as a refusal for 401 and 403.
 */
function withRefusalReason(ws: WebSocket): WebSocket {
  ws.on("unexpected-response", (_req, res) => {
    let body = "";
    res.setEncoding("utf8");
    res.on("data", (chunk: string) => { if (body.length < 1024) body += chunk; });
    res.on("end", () => {
      ws.emit("error", new Error(`Unexpected server response: ${res.statusCode}: ${body.slice(0, 1024).trim()}`));
      ws.terminate();
    });
  });
  return ws;
}

function failure(exc: unknown, debug: boolean): number {
  if (debug && exc instanceof Error) console.error(exc.stack);
  if (exc instanceof DeviceRefused) return fail(`the server refused this device: ${exc.message}`, EXIT_REFUSED);
  if (exc instanceof UsageError) return fail(exc.message, EXIT_USAGE);
  if (exc instanceof MissingPackages) return fail(exc.message, 1);
  const text = exc instanceof Error ? exc.message.split("\n")[0] || exc.name : String(exc);
  return fail(debug ? text : `${text} (--debug shows the stack)`, 1);
}

function fail(message: string, status: number): number {
  console.error(`error: ${message}`);
  return status;
}

/** Run the command and exit with its status once what it printed is written. */
async function main(argv: string[] = process.argv.slice(2)): Promise<never> {
  process.on("SIGINT", () => process.exit(130));
  let status: number;
  if (argv[0] === "install-service") status = installService(argv.slice(1));
  else {
    try {
      status = await device(argv);
    } catch (exc) {
      status = failure(exc, argv.includes("--debug"));
    }
  }
  return new Promise<never>(() => process.stdout.write("", () => process.stderr.write("", () => process.exit(status))));
}

await main();
