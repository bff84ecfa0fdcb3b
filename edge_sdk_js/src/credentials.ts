/**
 * A device proves it holds its enrolled secret without sending it (as edge_sdk/credentials.py, format 2):
 * `hmac2:<purpose>:<unix seconds>:<nonce hex>:<HMAC-SHA256(sha256(secret), message) hex>`, where
 * message = "edgetrain-proof-v2" NUL purpose NUL device id NUL seconds NUL nonce (UTF-8). The purpose is the door
 * the proof is for (`hello`, `upgrade`, `status`, `ticket`): the server takes it there only, once, within its
 * clock skew. tests/vectors/proofs.json holds the bytes both SDKs make.
 */
import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { bytesToHex } from "@noble/hashes/utils.js";
import { DeviceRefused } from "./errors.js";
import { ConnectionLost } from "./transport.js";

export const PROOF_SCHEME = "hmac2";
/** The label that opens every proof's message (domain separation). */
export const PROOF_LABEL = "edgetrain-proof-v2";
/** The doors a proof can be made for. */
export const PURPOSES = ["hello", "upgrade", "status", "ticket"] as const;
export type ProofPurpose = (typeof PURPOSES)[number];

/** Random bytes as hex, from the platform's cryptographic generator (Node and browsers). */
export function randomHex(bytes: number): string {
  return bytesToHex(globalThis.crypto.getRandomValues(new Uint8Array(bytes)));
}

/** The bytes a proof's HMAC signs. */
export function proofMessage(purpose: ProofPurpose, deviceId: string, seconds: number, nonce: string): Uint8Array {
  return new TextEncoder().encode([PROOF_LABEL, purpose, deviceId, String(seconds), nonce].join("\0"));
}

/** A proof of credential `secret` for one use at the door `purpose` (the hello's token by default). */
export function makeProof(deviceId: string, secret: string, purpose: ProofPurpose = "hello", now?: number, nonce?: string): string {
  if (!(PURPOSES as readonly string[]).includes(purpose)) throw new Error(`a proof's purpose is one of ${PURPOSES.join(", ")}, not ${String(purpose)}`);
  const seconds = Math.floor(now ?? Date.now() / 1000);
  const n = nonce ?? randomHex(16);
  const key = sha256(new TextEncoder().encode(secret));
  const mac = bytesToHex(hmac(sha256, key, proofMessage(purpose, deviceId, seconds, n)));
  return `${PROOF_SCHEME}:${purpose}:${seconds}:${n}:${mac}`;
}

/**
 * An `Authorization` header for the door `purpose`: a fresh proof of `secret` (`Edgetrain <id> <proof>`), else the
 * shared `token` (`Bearer`), else none. On the websocket upgrade (as edge_sdk.client.DeviceClient sends it) a server
 * proves the connection before the websocket opens, so a flood of connections that never say hello cannot keep this
 * device out; where the platform cannot set the upgrade's headers (a browser), a ticket does it (`fetchTicket`).
 */
export function authorizationHeader(deviceId: string, secret?: string, token?: string, purpose: ProofPurpose = "upgrade"): Record<string, string> {
  if (secret) return { Authorization: `Edgetrain ${deviceId} ${makeProof(deviceId, secret, purpose)}` };
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/**
 * A single-use ticket for one websocket upgrade of `deviceId` (docs/security.md, "Tickets"), from the server's
 * `/ticket.json` at `origin` (the page's own: `location.origin`): what a browser page carries on the upgrade as
 * `?ticket=` in place of the `Authorization` header it cannot set, so a flood of connections that never say hello
 * cannot keep it out. The request proves itself with a fresh proof made for `ticket`, or the token. A 401 or 403 is a
 * refusal (`DeviceRefused`: the page stops); a server that asks nothing (404) gives none (null); anything else is a
 * failure to connect (`ConnectionLost`: the device retries with backoff).
 */
export async function fetchTicket(origin: string, deviceId: string, secret?: string, token?: string): Promise<string | null> {
  let res: Response;
  try {
    res = await fetch(new URL(`/ticket.json?id=${encodeURIComponent(deviceId)}`, origin),
      { headers: authorizationHeader(deviceId, secret, token, "ticket"), cache: "no-store" });
  } catch (exc) {
    throw new ConnectionLost(`cannot fetch an upgrade ticket from ${origin}: ${(exc as Error).message}`);
  }
  const body = await res.json().catch(() => ({})) as { ticket?: string; error?: string };
  if (res.status === 401 || res.status === 403) {
    throw new DeviceRefused(`${res.status === 401 ? "unauthorized" : "forbidden"}: ${body.error ?? `HTTP ${res.status} on /ticket.json`}`);
  }
  if (res.status === 404) return null;
  if (!res.ok || typeof body.ticket !== "string") {
    throw new ConnectionLost(`no upgrade ticket from ${origin}: HTTP ${res.status} ${body.error ?? ""}`.trim());
  }
  return body.ticket;
}

/** `server` (a ws:// or wss:// URL) with `?ticket=<ticket>` for its upgrade request; as it is for no ticket. */
export function withTicket(server: string, ticket: string | null): string {
  if (ticket === null) return server;
  const url = new URL(server);
  url.searchParams.set("ticket", ticket);
  return url.toString();
}
