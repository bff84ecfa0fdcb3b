// The status page: polls /status.json (read-only) and draws it. The token (#token= or the form) or an
// enrolled device's credential (a fresh proof per request, never the secret) rides in Authorization.
import { makeProof } from "/sdk/dist/edgetrain.browser.mjs";

const $ = (id) => document.getElementById(id);
const fragment = new URLSearchParams(location.hash.slice(1));
const POLL_MS = 1000;
let auth = { token: fragment.get("token") ?? sessionStorage.getItem("edgetrain-token") ?? "",
  id: sessionStorage.getItem("edgetrain-id") ?? "", secret: sessionStorage.getItem("edgetrain-secret") ?? "" };
window.edgetrainStatus = null; // the last snapshot, for scripts reading the page

function header(mode) {
  if (mode === "credentials" && auth.id && auth.secret) return `Edgetrain ${auth.id} ${makeProof(auth.id, auth.secret, "status")}`;
  return auth.token ? `Bearer ${auth.token}` : "";
}

const fmtBytes = (b) => (b == null ? "–" : b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(1)} GiB` : `${Math.round(b / 2 ** 20)} MiB`);
const fmt = (v, digits = 4) => (v == null ? "–" : Number(v).toFixed(digits));

function cells(tr, values) {
  tr.replaceChildren(...values.map((v) => {
    const td = document.createElement("td");
    td.textContent = v == null ? "–" : String(v);
    return td;
  }));
}

function rows(tbody, items, key, values) {
  tbody.replaceChildren(...items.map((item) => {
    const tr = document.createElement("tr");
    tr.dataset[key] = String(item[key === "device" ? "id" : key]);
    cells(tr, values(item));
    return tr;
  }));
}

function lastReport(r) {
  if (!r) return "–";
  return `round ${r.round} ${r.phase}: ${r.accepted ? "accepted" : `not accepted (${r.reason})`}`;
}

/** Accuracy (0 to 1) over the run's rounds (1 to rounds_total, or further on a resumed run). */
function curve(rounds, total) {
  const points = rounds.filter((r) => r.complete && r.accuracy != null);
  const svg = $("accuracy");
  if (points.length === 0) { svg.innerHTML = ""; return; }
  const n = Math.max(total, ...points.map((p) => p.round));
  const xy = points.map((p) => [n <= 1 ? 300 : ((p.round - 1) / (n - 1)) * 580 + 10, 190 - p.accuracy * 180]);
  const line = xy.map(([x, y], i) => `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
  svg.innerHTML = `<line x1="10" y1="10" x2="590" y2="10" stroke="#ddd"/><line x1="10" y1="190" x2="590" y2="190" stroke="#ddd"/>
    <path d="${line}" fill="none" stroke="#1565c0" stroke-width="2" vector-effect="non-scaling-stroke"/>
    ${xy.map(([x, y]) => `<circle cx="${x}" cy="${y}" r="3" fill="#1565c0"/>`).join("")}
    <text x="14" y="24" font-size="12" fill="#666">1.0</text><text x="14" y="186" font-size="12" fill="#666">0</text>
    <text x="520" y="24" font-size="12" fill="#1565c0">${points.at(-1).accuracy.toFixed(3)}</text>`;
}

/** A DP run's spend: epsilon of its target at delta, and who adds the noise (the server, or the devices
 * inside secure aggregation). */
function privacyWords(p) {
  const target = p.target_epsilon != null ? ` of ${p.target_epsilon}` : "";
  const mode = p.mode === "distributed" ? "distributed noise (the devices add it inside secure aggregation)"
    : "central noise (the server adds it)";
  return `epsilon ${Number(p.epsilon).toPrecision(4)}${target} at delta ${Number(p.delta).toPrecision(3)} after ${p.rounds} rounds; ${mode}`;
}

function draw(s) {
  window.edgetrainStatus = s;
  $("run").textContent = `${s.model}, ${s.strategy}`;
  $("rounds-done").textContent = s.rounds_done;
  $("rounds-total").textContent = s.rounds_total;
  $("current").textContent = s.current ? `round ${s.current.round}: ${s.current.reported} of ${s.current.selected} reported, ${Math.round(s.current.deadline_s)} s to its deadline` : "none";
  $("connected").textContent = s.devices.filter((d) => d.connected).length;
  $("device-count").textContent = s.devices.length;
  $("updated").textContent = new Date(s.time * 1000).toLocaleTimeString();
  $("privacy").hidden = $("privacy-label").hidden = !s.privacy;
  if (s.privacy) $("privacy").textContent = privacyWords(s.privacy);
  rows($("devices"), s.devices, "device", (d) => [d.id, d.connected ? "yes" : "no", d.runtimes.join(", ") || "torch",
    d.role, d.split, d.peak_bytes ? `${fmtBytes(d.peak_bytes)} of ${fmtBytes(d.budget_bytes)}` : fmtBytes(d.budget_bytes),
    lastReport(d.last_report), d.trained_on]);
  rows($("rounds"), [...s.rounds].reverse(), "round", (r) => [r.round, r.complete ? "done" : "running", r.selected,
    r.reported, fmt(r.accuracy), fmt(r.loss), r.finished ? (r.finished - r.started).toFixed(1) : "–"]);
  curve(s.rounds, s.rounds_total);
  $("notices").replaceChildren(...s.notices.map((n) => {
    const li = document.createElement("li");
    li.textContent = `${new Date(n.time * 1000).toLocaleTimeString()} ${n.kind} ${n.device}${n.round != null ? ` round ${n.round}` : ""}: ${n.message}`;
    return li;
  }));
}

function login(info, why) {
  $("status").hidden = true;
  $("login").hidden = false;
  $("login-why").textContent = why;
  $("login-id-row").hidden = info.auth !== "credentials";
  $("login-secret-label").textContent = info.auth === "credentials" ? "Credential" : "Token";
}

async function poll(info) {
  const res = await fetch("/status.json", { headers: { Authorization: header(info.auth) }, cache: "no-store" });
  if (res.status === 401) {
    login(info, (await res.json()).error);
    return;
  }
  if (!res.ok) throw new Error(`status: HTTP ${res.status}`);
  $("login").hidden = true;
  $("status").hidden = false;
  draw(await res.json());
  setTimeout(() => poll(info).catch(retry(info)), POLL_MS);
}

const retry = (info) => (exc) => {
  $("updated").textContent = `no answer from the server (${exc.message}): the run may have ended; still asking`;
  setTimeout(() => poll(info).catch(retry(info)), 3 * POLL_MS);
};

async function main() {
  const info = await (await fetch("/web.json")).json();
  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    const secret = $("login-secret").value.trim();
    auth = info.auth === "credentials" ? { token: "", id: $("login-id").value.trim(), secret } : { token: secret, id: "", secret: "" };
    sessionStorage.setItem("edgetrain-token", auth.token);
    sessionStorage.setItem("edgetrain-id", auth.id);
    sessionStorage.setItem("edgetrain-secret", auth.secret);
    poll(info).catch(retry(info));
  });
  await poll(info);
}

main().catch((exc) => { $("updated").textContent = exc.message; });
