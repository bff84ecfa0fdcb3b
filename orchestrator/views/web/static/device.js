// The device page: joins this server's run as a browser device (onnxruntime-web) and trains the demo's
// shard or the person's own data (a CSV file, a folder of images, a text file: read here, never uploaded), on the
// GPU (WebGPU) where the browser has one and the person leaves it on.
// Query: ?id=&budget=&shard=&webgpu=0&autostart=1; fragment: #token= or #secret= (kept out of requests).
// Pauses while hidden, while a condition is not met (charging, unmetered network) or when the person
// says; holds a screen wake lock while it trains. docs/web.md says what each part does.
import { DeviceClient, csvData, decodeTensors, fetchTicket, imageData, indexedDbStore, makeBackend, makeProof, makeRuntime, textData } from "/sdk/dist/edgetrain.browser.mjs";

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const fragment = new URLSearchParams(location.hash.slice(1));
const MiB = 2 ** 20;
const JOINED = "edgetrain-joined"; // set while the person wants this device in the run: a reload joins again
const state = { state: "not started", role: null, split: null, rounds: 0, reports: [], events: [], error: null,
  paused: [], budgetSource: null, conditions: {}, backend: null, adapter: null, samples: null,
  noGpu: null };
window.edgetrain = state; // for scripts driving the page
let client = null;
let wakeLock = null;
let stopAsked = false;
const pauseReasons = new Set();

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

/** The data the person chose: the demo's shard, a CSV file or a folder of images. */
async function chosenData(info) {
  const kind = document.querySelector("input[name=data]:checked").value;
  if (kind === "csv") {
    const file = $("csv").files[0];
    if (!file) throw new Error("pick a CSV file");
    return { ...csvData(await file.text()), source: file.name };
  }
  if (kind === "text") { // next-character windows of the model's input length, in its vocabulary
    const file = $("text").files[0];
    if (!file) throw new Error("pick a text file");
    return { ...textData(await file.text(), { context: info.input_shape[0] }), source: file.name };
  }
  if (kind === "images") {
    if ($("images").files.length === 0) throw new Error("pick a folder of images");
    return { ...(await imageData($("images").files, info.input_shape)), source: "your images" };
  }
  const shard = Number($("shard").value || hashShard($("device-id").value.trim(), info.shards));
  const res = await fetch(`/shard/${shard}.bin`);
  if (!res.ok) throw new Error(`demo shard ${shard}: ${(await res.text()).trim()}`);
  const data = decodeTensors(new Uint8Array(await res.arrayBuffer()));
  return { x: data.x, y: data.y, source: `demo shard ${shard}` };
}

/**
 * The budget the page offers: a quarter of the memory the browser reports (navigator.deviceMemory, a
 * secure context's), and never less than the least the server plans this device for (/budget.json,
 * from the server's own planning); without a reported size, that least budget.
 */
async function offeredBudget(samples) {
  const least = await leastBudget(samples, $("webgpu").checked ? "onnxruntime-webgpu" : "onnxruntime-web");
  if (least.error) return { budget: null, source: `(the server plans no browser device: ${least.error})` };
  const leastMiB = Math.ceil(least.budget_bytes / MiB);
  const gib = navigator.deviceMemory;
  if (!gib) return { budget: `${leastMiB}MiB`, source: `(the least the server plans this device for, ${least.role}; the browser reports no memory size)` };
  const quarter = Math.min(2048, Math.floor((gib * 1024) / 4));
  if (quarter >= leastMiB) return { budget: `${quarter}MiB`, source: `(a quarter of the ${gib} GiB the browser reports)` };
  return { budget: `${leastMiB}MiB`, source: `(the least the server plans this device for; a quarter of the ${gib} GiB the browser reports is less)` };
}

/** The least budget the server plans a tab on `runtime` for (the GPU path holds more than WebAssembly), or `{ error }`
 * (the server's reason, or offline with no copy kept). */
async function leastBudget(samples, runtime) {
  try {
    const res = await fetch(`/budget.json?samples=${samples}&runtime=${runtime}`);
    const least = await res.json();
    return res.ok ? least : { error: least.error ?? res.statusText };
  } catch (exc) {
    return { error: exc instanceof Error ? exc.message : String(exc) };
  }
}

/** The device's rounds in the run, as the server's journal has them (a reopened tab counts those of earlier tabs). */
async function journalRounds(deviceId) {
  const secret = $("secret").value || fragment.get("secret") || "";
  const auth = secret ? `Edgetrain ${deviceId} ${makeProof(deviceId, secret, "status")}`
    : fragment.get("token") ? `Bearer ${fragment.get("token")}` : "";
  const res = await fetch(`/device.json?id=${encodeURIComponent(deviceId)}`, { headers: auth ? { Authorization: auth } : {}, cache: "no-store" });
  if (res.ok) set("rounds", (await res.json()).rounds);
}

function onEvent(info, deviceId, path) {
  return (kind, d) => {
    log(kind, d);
    if (kind === "welcome") { set("role", d.role); set("split", d.split); set("state", "waiting for a round"); journalRounds(deviceId).catch(() => {}); }
    if (kind === "round_done") {
      state.reports.push(d);
      if (d.backend && d.backend !== state.backend) showPath(d.backend, path.backend?.fallback ?? null, path.threads);
      $("progress").value = Math.min(1, d.round / info.rounds);
      set("state", `round ${d.round} ${d.accepted ? "accepted" : `not accepted: ${d.reason}`}`);
      if (d.accepted) { set("rounds", state.rounds + 1); journalRounds(deviceId).catch(() => {}); }
    }
    if (kind === "reconnect") set("state", `reconnecting (attempt ${d.attempt})`);
    if (kind === "stopped") set("state", "stopped");
    if (kind === "paused") { set("state", `paused (${[...pauseReasons].join(", ")})`); releaseWakeLock(); }
    if (kind === "resumed") { set("state", "connecting"); holdWakeLock(); }
    if (kind === "error") $("error").textContent = `${d.code}: ${d.message}`;
  };
}

async function train(info) {
  const deviceId = $("device-id").value.trim();
  localStorage.setItem("edgetrain-device-id", deviceId);
  set("state", "loading data");
  const data = await chosenData(info);
  set("samples", `${data.x.shape[0]} (${data.source})`);
  if ($("budget").dataset.auto === "1" || !$("budget").value.trim()) await showBudget(data.x.shape[0]);
  const budgetBytes = parseBudget($("budget").value);
  const threads = crossOriginIsolated ? Math.max(1, Math.min(4, navigator.hardwareConcurrency || 1)) : 1;
  const { runtime, backend } = await trainingPath(threads, budgetBytes, data.x.shape[0]);
  const labels = data.y.data;
  let top = -1n;
  for (const v of labels) if (v > top) top = v;
  const token = fragment.get("token") ?? "", secret = $("secret").value || fragment.get("secret") || "";
  client = new DeviceClient({
    server: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`, deviceId, budgetBytes,
    runtime, backend, cores: threads,
    webSocket: (url) => new WebSocket(url), data: { x: data.x, y: data.y },
    numClasses: Math.max(data.classes?.length ?? 0, Number(top) + 1),
    token, secret,
    // A page cannot set the upgrade's Authorization header: a single-use ticket from /ticket.json takes its place.
    upgradeTicket: info.auth === "none" ? undefined : () => fetchTicket(location.origin, deviceId, secret, token),
    labels: { page: "web" }, maxRetries: Infinity, // a phone that goes offline comes back whenever the server answers
    // An update not yet acknowledged survives closing the tab: reopened, the page finishes its upload.
    pending: indexedDbStore(deviceId),
    onEvent: onEvent(info, deviceId, { backend, threads }),
  });
  localStorage.setItem(JOINED, "1");
  setButtons(true);
  if (pauseReasons.size) client.pause(); else holdWakeLock();
  set("state", pauseReasons.size ? `paused (${[...pauseReasons].join(", ")})` : "connecting");
  stopAsked = false;
  await client.run();
  set("state", stopAsked ? "stopped" : "finished");
  if (!stopAsked) $("progress").value = 1; // the server said goodbye: the run is over
  client = null;
  setButtons(false);
  releaseWakeLock();
}

/** Why this browser cannot train on its GPU (no WebGPU, or no adapter), or null where it can. */
async function gpuMissing() {
  if (!navigator.gpu) return "this browser has no WebGPU";
  return (await navigator.gpu.requestAdapter().catch(() => null)) ? null : "no WebGPU adapter";
}

/**
 * What trains: onnxruntime-web's WebGPU build on the GPU (operators without a WebGPU kernel on
 * WebAssembly, and all of it on WebAssembly if the GPU goes away), or, without an adapter, with
 * WebGPU turned off or with a budget below the GPU path's least, its WebAssembly build. The frozen
 * chunks run on WebAssembly either way.
 */
async function trainingPath(threads, budgetBytes, samples) {
  // The GPU path holds more than WebAssembly: a budget below its least trains on WebAssembly.
  const gpuLeast = $("webgpu").checked ? await leastBudget(samples, "onnxruntime-webgpu") : null;
  const small = gpuLeast !== null && !gpuLeast.error && budgetBytes < gpuLeast.budget_bytes
    ? `the GPU needs a budget of ${Math.ceil(gpuLeast.budget_bytes / MiB)} MiB` : null;
  const wanted = $("webgpu").checked && small === null;
  const adapter = wanted ? await navigator.gpu.requestAdapter().catch(() => null) : null;
  const ort = await import(adapter ? "/sdk/ort/ort.webgpu.min.mjs" : "/sdk/ort/ort.wasm.min.mjs");
  ort.env.wasm.wasmPaths = "/sdk/ort/";
  const runtime = makeRuntime("onnxruntime-web", ort, threads);
  if (!adapter) {
    showPath(runtime.name, state.noGpu ?? small ?? (wanted ? "no WebGPU adapter" : "WebGPU turned off"), threads);
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

function setButtons(running) {
  $("start").disabled = running;
  $("pause").disabled = !running;
  $("stop").disabled = !running;
  $("pause").textContent = pauseReasons.has("you paused") ? "Resume" : "Pause";
}

/** Pause for any reason that holds (hidden, a condition, the person), resume when none does. */
function pauseFor(reason, holds) {
  if (holds) pauseReasons.add(reason); else pauseReasons.delete(reason);
  state.paused = [...pauseReasons];
  if (client === null) return;
  if (pauseReasons.size) {
    if (!client.paused) client.pause();
    set("state", `pausing (${state.paused.join(", ")})`);
  } else if (client.paused) client.resume();
  setButtons(true);
}

async function holdWakeLock() {
  if (!("wakeLock" in navigator) || document.visibilityState !== "visible" || wakeLock) return;
  try {
    wakeLock = await navigator.wakeLock.request("screen");
    wakeLock.addEventListener("release", () => { wakeLock = null; });
  } catch { /* refused (battery saver): training goes on, the screen may sleep */ }
}

function releaseWakeLock() {
  wakeLock?.release();
  wakeLock = null;
}

/** Conditions the person (or the server: web.json) sets, checked where the browser tells. */
async function watchConditions(info) {
  for (const name of info.conditions) $(`when-${name}`).checked = true;
  const battery = navigator.getBattery ? await navigator.getBattery().catch(() => null) : null;
  const connection = navigator.connection;
  const metered = () => connection?.type === "cellular" || connection?.saveData === true;
  state.conditions = { battery: battery !== null, network: connection?.type !== undefined };
  $("charging-note").textContent = battery ? "" : "(this browser does not tell: not checked)";
  $("unmetered-note").textContent = connection?.type !== undefined ? "" : "(this browser does not tell the network type: not checked)";
  const check = () => {
    pauseFor("not charging", $("when-charging").checked && battery !== null && !battery.charging);
    pauseFor("metered network", $("when-unmetered").checked && connection?.type !== undefined && metered());
  };
  battery?.addEventListener("chargingchange", check);
  connection?.addEventListener?.("change", check);
  $("when-charging").addEventListener("change", check);
  $("when-unmetered").addEventListener("change", check);
  check();
}

/** Why the page runs on one thread, where it does, and what that costs. */
function isolationNote() {
  if (crossOriginIsolated) return "yes (WebAssembly threads)";
  if (!isSecureContext) {
    return "no: plain http on a network address is not a secure context, so the browser gives no threads (one), "
      + "no memory size and no WebCrypto; open the page over https (the server prints how a phone trusts it)";
  }
  return "no: the browser did not isolate the page (COOP/COEP), so ONNX Runtime runs on one thread";
}

async function showBudget(samples) {
  state.samples = samples;
  const offered = await offeredBudget(samples);
  if (offered.budget === null) throw new Error(offered.source.slice(1, -1));
  $("budget").value = offered.budget;
  $("budget").dataset.auto = "1";
  state.budgetSource = offered.source;
  $("budget-source").textContent = offered.source;
}

async function runInfo() {
  for (;;) {
    try {
      const res = await fetch("/web.json");
      if (res.ok) return await res.json();
    } catch { /* offline, and no copy kept yet */ }
    $("offline").hidden = false;
    $("offline").textContent = "The server does not answer: waiting for it.";
    await new Promise((resolve) => setTimeout(resolve, 3000));
  }
}

/**
 * Install the service worker and wait (a few seconds at most) until it serves this page, so that the run,
 * the budget and the data this visit fetches are kept too: a reload with the server gone opens the page.
 * The install goes on in the background where it takes longer (a slow network, a busy phone): the page
 * works without it, only not offline until it is in.
 */
async function controlled() {
  if (!navigator.serviceWorker) return;
  navigator.serviceWorker.addEventListener("message", (event) => {
    if (event.data?.type === "install-failed") log("service_worker", { error: event.data.error });
  });
  const installed = install();
  if (navigator.serviceWorker.controller) return;
  await Promise.race([new Promise((resolve) => navigator.serviceWorker.addEventListener("controllerchange", resolve, { once: true })),
    installed, new Promise((resolve) => setTimeout(resolve, 30_000))]);
}

/**
 * Register the service worker; where its install fails (a precached file the server did not give in time,
 * a disk too full for the origin's quota: the worker says which in an "install-failed" message), the
 * browser drops the registration, so register again after a pause, a few times. Resolves when a worker
 * is in or the tries are spent.
 */
async function install(tries = 4) {
  for (let attempt = 1; attempt <= tries; attempt++) {
    let registration;
    try {
      registration = await navigator.serviceWorker.register("/sw.js");
    } catch (exc) {
      log("service_worker", { error: String(exc), attempt });
      return;
    }
    if (await settles(registration)) return;
    log("service_worker", { error: "the install failed", attempt, retry: attempt < tries });
    await new Promise((resolve) => setTimeout(resolve, 3000 * attempt));
  }
}

/** Whether the registration ends with a worker in (installed or active), not with its install failed. */
function settles(registration) {
  const worker = registration.installing;
  const workerIn = () => registration.active !== null || registration.waiting !== null;
  if (worker === null) return Promise.resolve(workerIn());
  return new Promise((resolve) => worker.addEventListener("statechange", () => {
    if (worker.state !== "installing") resolve(worker.state !== "redundant" || workerIn() || settles(registration)); // a newer worker took over
  }));
}

async function main() {
  await controlled();
  set("isolated", isolationNote());
  $("threads-note").textContent = isolationNote();
  const info = await runInfo();
  $("offline").hidden = true;
  $("run").textContent = `${info.model}: ${info.rounds} rounds of ${info.local_steps} local steps, on ${info.data}`;
  if (info.sdk_missing) throw new Error(info.sdk_missing);
  $("secret-row").hidden = info.auth !== "credentials";
  $("device-id").value = query.get("id") ?? localStorage.getItem("edgetrain-device-id")
    ?? `web-${Math.random().toString(16).slice(2, 8)}`;
  $("shard").value = query.get("shard") ?? "";
  state.noGpu = await gpuMissing();
  $("webgpu").disabled = state.noGpu !== null;
  $("webgpu").checked = state.noGpu === null && query.get("webgpu") !== "0";
  $("webgpu-note").textContent = state.noGpu === null ? "" : `(${state.noGpu}: WebAssembly)`;
  $("webgpu").addEventListener("change", () => { // the GPU path's least budget is another
    if ($("budget").dataset.auto === "1" && state.samples) showBudget(state.samples).catch(() => {});
  });
  $("shard").max = String(info.shards - 1);
  $("shard").placeholder = `0–${info.shards - 1} (default: from the id)`;
  $("budget").addEventListener("input", () => { $("budget").dataset.auto = "0"; $("budget-source").textContent = ""; });
  if (query.get("budget")) $("budget").value = query.get("budget");
  else {
    try {
      await showBudget((await chosenData(info)).x.shape[0]);
    } catch (exc) { // offline, or the server plans no browser device: said again at Join
      $("budget-source").textContent = `(${exc instanceof Error ? exc.message : exc})`;
    }
  }
  await watchConditions(info);
  document.addEventListener("visibilitychange", () => {
    pauseFor("hidden", document.visibilityState === "hidden");
    if (document.visibilityState === "visible" && client && !client.paused) holdWakeLock();
  });
  const start = () => {
    $("error").textContent = "";
    state.error = null;
    train(info).catch(fail);
  };
  $("join").addEventListener("submit", (e) => { e.preventDefault(); start(); });
  $("pause").addEventListener("click", () => pauseFor("you paused", !pauseReasons.has("you paused")));
  $("stop").addEventListener("click", () => {
    // First tap: after the round at hand; second: at once.
    const now = stopAsked;
    stopAsked = true;
    set("state", "stopping");
    localStorage.removeItem(JOINED);
    client?.stop({ now });
  });
  $("start").disabled = false;
  if (query.get("autostart") === "1" || localStorage.getItem(JOINED) === "1") start();
}

function fail(exc) {
  state.error = exc instanceof Error ? exc.message : String(exc);
  set("state", "stopped");
  $("error").textContent = state.error;
  client = null;
  setButtons(false);
  releaseWakeLock();
}

main().catch(fail);
