// The device page: joins this server's run as a browser device (onnxruntime-web) and trains the
// demo's shard, on the GPU (WebGPU) where the browser has one and the person leaves it on.
// Query: ?id=&budget=&shard=&webgpu=0&autostart=1; fragment: #token= or #secret= (kept out of requests).
import { DeviceClient, decodeTensors, indexedDbStore, makeBackend, makeRuntime } from "/sdk/dist/index.js";

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const fragment = new URLSearchParams(location.hash.slice(1));
const MiB = 2 ** 20;
const state = { state: "not started", role: null, split: null, rounds: 0, reports: [], events: [], error: null, backend: null,
  adapter: null };
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
  const { runtime, backend } = await trainingPath(threads);
  const server = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`;
  const client = new DeviceClient({
    server, deviceId, budgetBytes, runtime, backend, cores: threads,
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
        if (d.backend && d.backend !== state.backend) showPath(d.backend, backend?.fallback ?? null, threads);
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

/**
 * What trains: onnxruntime-web's WebGPU build on the GPU (operators without a WebGPU kernel on
 * WebAssembly, and all of it on WebAssembly if the GPU goes away), or, without an adapter or with
 * WebGPU turned off, its WebAssembly build. The frozen chunks run on WebAssembly either way.
 */
async function trainingPath(threads) {
  const wanted = $("webgpu").checked;
  const adapter = wanted ? await navigator.gpu.requestAdapter().catch(() => null) : null;
  const ort = await import(adapter ? "/sdk/ort/ort.webgpu.min.mjs" : "/sdk/ort/ort.wasm.min.mjs");
  ort.env.wasm.wasmPaths = "/sdk/ort/";
  const runtime = makeRuntime("onnxruntime-web", ort, threads);
  if (!adapter) {
    showPath(runtime.name, !navigator.gpu ? "this browser has no WebGPU" : wanted ? "no WebGPU adapter" : "WebGPU turned off", threads);
    return { runtime, backend: undefined };
  }
  set("state", "looking for the GPU");
  const backend = makeBackend("onnxruntime-webgpu", runtime, threads);
  const probe = await backend.probe();
  state.adapter = backend.adapter;
  showPath(backend.name, probe.off ?? null, threads);
  return { runtime, backend };
}

function showPath(backend, fallback, threads) {
  state.backend = backend;
  const cpu = `WebAssembly, ${threads} thread${threads > 1 ? "s" : ""}`;
  const adapter = state.adapter ? [state.adapter.vendor, state.adapter.architecture].filter(Boolean).join(" ") : "";
  set("runtime", backend === "onnxruntime-webgpu" ? `onnxruntime-web on the GPU (WebGPU${adapter ? `: ${adapter}` : ""})`
    : `onnxruntime-web (${cpu}${fallback ? `; ${fallback}` : ""})`);
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
  $("webgpu").disabled = !navigator.gpu;
  $("webgpu").checked = Boolean(navigator.gpu) && query.get("webgpu") !== "0";
  $("webgpu-note").textContent = navigator.gpu ? "" : "(this browser has no WebGPU: WebAssembly)";
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
