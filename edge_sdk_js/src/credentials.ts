/**
 * A device proves it holds its enrolled secret without sending it (as edge_sdk/credentials.py):
 * `Hello.token` = `hmac1:<unix seconds>:<nonce hex>:<HMAC-SHA256(sha256(secret), "<id>|<seconds>|<nonce>") hex>`.
 */
import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { bytesToHex } from "@noble/hashes/utils.js";

export const PROOF_SCHEME = "hmac1";

/** Random bytes as hex, from the platform's cryptographic generator (Node and browsers). */
export function randomHex(bytes: number): string {
  return bytesToHex(globalThis.crypto.getRandomValues(new Uint8Array(bytes)));
}

/** The `Hello.token` of a device with credential `secret`, for one connection. */
export function makeProof(deviceId: string, secret: string, now?: number, nonce?: string): string {
  const seconds = Math.floor(now ?? Date.now() / 1000);
  const n = nonce ?? randomHex(16);
  const text = new TextEncoder();
  const key = sha256(text.encode(secret));
  const mac = bytesToHex(hmac(sha256, key, text.encode(`${deviceId}|${seconds}|${n}`)));
  return `${PROOF_SCHEME}:${seconds}:${n}:${mac}`;
}

/**
 * The websocket upgrade request's `Authorization` header (as edge_sdk.client.DeviceClient sends it): a fresh
 * proof of `secret` (`Edgetrain <id> <proof>`, another than the hello's), else the shared `token` (`Bearer`),
 * else none. A server proves the connection before the websocket opens, so a flood of connections that never
 * say hello cannot keep this device out; where the platform cannot set headers (a browser), it is left out.
 */
export function authorizationHeader(deviceId: string, secret?: string, token?: string): Record<string, string> {
  if (secret) return { Authorization: `Edgetrain ${deviceId} ${makeProof(deviceId, secret)}` };
  return token ? { Authorization: `Bearer ${token}` } : {};
}
