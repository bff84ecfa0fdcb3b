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
