/**
 * The device's progress as a person reads it: one line per event, in the Python device's text log
 * format (edge_sdk/logs.py: `2026-12-06 01:02:03 INFO joined as weak at split 3`), the events a person
 * watches for as sentences and the rest as `kind key=value ...`. `--json-events` prints the events as
 * JSON lines instead, for a supervisor, as `edgetrain serve --json-events` does for the server.
 */
import type { EventSink } from "./roundwork.js";

/** Events logged as warnings (the Python device's `_WARNING_EVENTS`, and an error it reports). */
const WARNING_EVENTS = new Set(["reconnect", "aborted", "error"]);

/** A field's value as the Python device's `_value` writes it: 4 significant digits, lists joined by commas. */
function value(v: unknown): string {
  if (typeof v === "number" && !Number.isInteger(v)) return String(Number(v.toPrecision(4)));
  if (Array.isArray(v)) return v.map(value).join(",") || "-";
  if (v !== null && typeof v === "object") return Object.entries(v).map(([k, i]) => `${k}:${value(i)}`).join(",") || "-";
  return String(v);
}

const seconds = (s: unknown): string => `${Number(s ?? 0).toFixed(1)} s`;

/** "2.3026 -> 2.1012" where the report carried the loss before and after its steps. */
function loss(f: Record<string, unknown>): string {
  return typeof f["loss_before"] === "number" && typeof f["loss_after"] === "number"
    ? `, loss ${f["loss_before"].toFixed(4)} -> ${f["loss_after"].toFixed(4)}` : "";
}

/** A round's report as a line: what it trained, on what, whether the server took it, where the time went. */
function roundLine(f: Record<string, unknown>): string {
  const [from = 0, to = 0] = (f["trained"] as number[] | undefined) ?? [];
  const blocks = to - from > 1 ? `blocks ${from}-${to - 1}` : to - from === 1 ? `block ${from}` : "nothing";
  const what = f["phase"] === "train"
    ? `trained ${blocks} (${f["role"]}) on ${f["backend"] ?? f["runtime"]}${loss(f)}` : `${f["phase"]}`;
  const verdict = f["accepted"] ? "accepted" : `not accepted${f["reason"] ? ` (${f["reason"]})` : ""}`;
  const times = ["download_s", "forward_s", "train_s", "eval_s", "upload_s"].filter((k) => Number(f[k] ?? 0) >= 0.05)
    .map((k) => `${k.slice(0, -2)} ${seconds(f[k])}`);
  return `round ${f["round"]}: ${what}, ${verdict}${times.length ? `; ${times.join(", ")}` : ""}`;
}

/** One readable line for an event (without the time and level): edge_sdk.logs.describe's sentences, and the JavaScript device's own. */
export function describe(kind: string, f: Record<string, unknown>): string {
  switch (kind) {
    case "reconnect":
      return `server ${f["server"] ?? ""} unreachable (${f["error"] ?? ""}); retry ${f["attempt"]} in ${Number(f["delay_s"] ?? 0).toFixed(1)} s`;
    case "welcome":
      return `joined as ${f["role"]} at split ${f["split"]}`;
    case "run_over":
      return `the run is over after ${f["rounds"]} rounds here; looking for the next run in ${Number(f["next_check_s"] ?? 0).toFixed(1)} s`;
    case "round_done":
      return roundLine(f);
    case "pausing": case "stopping":
      return `${kind} ${f["now"] ? "now" : "after the round at hand"}`;
    case "paused": case "resumed":
      return kind;
    case "stopped":
      return f["reports"] === undefined ? "stopped" : `stopped after ${f["reports"]} reports`;
    case "error":
      return `error ${f["code"]}: ${f["message"]}`;
    default: {
      const rest = Object.entries(f).filter(([k]) => k !== "device").map(([k, v]) => `${k}=${value(v)}`).join(" ");
      return `${kind} ${rest}`.trimEnd();
    }
  }
}

/** `2026-12-06 01:02:03`: the Python text log's time (local). */
function stamp(at: Date): string {
  const p = (n: number) => String(n).padStart(2, "0");
  return `${at.getFullYear()}-${p(at.getMonth() + 1)}-${p(at.getDate())} ${p(at.getHours())}:${p(at.getMinutes())}:${p(at.getSeconds())}`;
}

/** The line a person reads for an event: time, level and `describe`'s sentence. */
export function logLine(kind: string, fields: Record<string, unknown>, at = new Date()): string {
  return `${stamp(at)} ${WARNING_EVENTS.has(kind) ? "WARNING" : "INFO"} ${describe(kind, fields)}`;
}

/** Events as JSON lines on `out` (`--json-events`: for a supervisor), or readable lines on `err`. */
export function eventPrinter(json: boolean, out: (line: string) => void = console.log,
  err: (line: string) => void = console.error): EventSink {
  return (kind, data) => (json ? out(JSON.stringify({ event: kind, ...data })) : err(logLine(kind, data)));
}
