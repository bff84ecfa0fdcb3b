// The device page: joins this server's run as a browser device (onnxruntime-web) and trains the
// demo's shard. Query: ?id=&budget=&shard=&autostart=1; fragment: #token= or #secret= (kept out of requests).
import * as ort from "/sdk/ort/ort.wasm.min.mjs";
import { DeviceClient, decodeTensors, indexedDbStore, makeRuntime } from "/sdk/dist/edgetrain.browser.mjs";

ort.env.wasm.wasmPaths = "/sdk/ort/";
const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const fragment = new URLSearchParams(location.hash.slice(1));
const MiB = 2 ** 20;
const state = { state: "not started", role: null, split: null, rounds: 0, reports: [], events: [], error: null };
window.edgetrain = state; // for scripts driving the page

function set(key, value) {
  state[key] = value;
  const el = $(key);
  if (el) el.textContent = value === null ? "–" : String(value);
}

/** "300MiB", "1.5GiB", "300MB", "300" (MiB) as bytes. */
function parseBudget(text) {
  const m = /^\s*([\d.]+)\s*([KMG]i?B?)?\s*$/i.exec(text);
  if (!m) throw new Error(`a budget is a size such as 300MiB or 1.5GiB, not ${JSON.stringify(text)}`);
  const unit = (m[2] ?? "MiB").toUpperCase();
  const base = unit.includes("I") || unit.length === 1 ? 1024 : 1000;
  return Math.round(Number(m[1]) * base ** ("KMG".indexOf(unit[0]) + 1));
}

/** A budget from the memory the browser reports (navigator.deviceMemory, GiB, where it exists): a quarter of it. */
function reportedBudget() {
  const gib = navigator.deviceMemory;
  if (!gib) return { budget: "300MiB", source: "(the browser reports no memory size: set what this device may use)" };
  const mib = Math.max(128, Math.min(2048, Math.floor((gib * 1024) / 4)));
  return { budget: `${mib}MiB`, source: `(a quarter of the ${gib} GiB the browser reports)` };
}

function log(kind, data) {
  state.events.push({ event: kind, ...data });
  const li = document.createElement("li");
  const { device: _, ...rest } = data;
  li.textContent = `${new Date().toLocaleTimeString()} ${kind} ${JSON.stringify(rest)}`;
  $("log").prepend(li);
}

function hashShard(id, shards) {
  let h = 0;
  for (const c of id) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return h % shards;
}

async function train(info) {
  const deviceId = $("device-id").value.trim();
  const budgetBytes = parseBudget($("budget").value);
  const shard = Number($("shard").value || hashShard(deviceId, info.shards));
  localStorage.setItem("edgetrain-device-id", deviceId);
  set("state", "loading data");
  const res = await fetch(`/shard/${shard}.bin`);
  if (!res.ok) throw new Error(`demo shard ${shard}: ${(await res.text()).trim()}`);
  const data = decodeTensors(new Uint8Array(await res.arrayBuffer()));
  set("samples", data.x.shape[0]);
  const threads = crossOriginIsolated ? Math.max(1, Math.min(4, navigator.hardwareConcurrency || 1)) : 1;
  set("runtime", `onnxruntime-web, ${threads} thread${threads > 1 ? "s" : ""}`);
  const server = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`;
  const client = new DeviceClient({
    server, deviceId, budgetBytes, runtime: makeRuntime("onnxruntime-web", ort, threads), cores: threads,
    webSocket: (url) => new WebSocket(url), data: { x: data.x, y: data.y },
    token: fragment.get("token") ?? "", secret: $("secret").value || fragment.get("secret") || "",
    labels: { page: "web" },
    // An update not yet acknowledged survives closing the tab: reopened, the page finishes its upload.
    pending: indexedDbStore(deviceId),
    onEvent: (kind, d) => {
      log(kind, d);
      if (kind === "welcome") { set("role", d.role); set("split", d.split); set("state", "waiting for a round"); }
      if (kind === "round_done") {
        state.reports.push(d);
        set("rounds", state.reports.filter((r) => r.accepted).length);
        $("progress").value = Math.min(1, state.rounds / info.rounds);
        set("state", `round ${d.round} ${d.accepted ? "accepted" : `not accepted: ${d.reason}`}`);
      }
      if (kind === "reconnect") set("state", `reconnecting (attempt ${d.attempt})`);
      if (kind === "error") $("error").textContent = `${d.code}: ${d.message}`;
    },
  });
  set("state", "connecting");
  await client.run();
  set("state", "finished");
  $("progress").value = 1;
}

async function main() {
  set("isolated", crossOriginIsolated ? "yes (WebAssembly threads)" : "no (one thread)");
  const info = await (await fetch("/web.json")).json();
  $("run").textContent = `${info.model}: ${info.rounds} rounds of ${info.local_steps} local steps, on ${info.data}`;
  if (info.sdk_missing) throw new Error(info.sdk_missing);
  $("secret-row").hidden = info.auth !== "credentials";
  const reported = reportedBudget();
  $("device-id").value = query.get("id") ?? localStorage.getItem("edgetrain-device-id")
    ?? `web-${Math.random().toString(16).slice(2, 8)}`;
  $("budget").value = query.get("budget") ?? reported.budget;
  $("budget-source").textContent = query.get("budget") ? "" : reported.source;
  $("shard").value = query.get("shard") ?? "";
  $("shard").max = String(info.shards - 1);
  $("shard").placeholder = `0–${info.shards - 1} (default: from the id)`;
  const start = () => {
    $("start").disabled = true;
    train(info).catch(fail);
  };
  $("join").addEventListener("submit", (e) => { e.preventDefault(); start(); });
  $("start").disabled = false;
  if (query.get("autostart") === "1") start();
}

function fail(exc) {
  state.error = exc instanceof Error ? exc.message : String(exc);
  set("state", "stopped");
  $("error").textContent = state.error;
  $("start").disabled = false;
}

main().catch(fail);
