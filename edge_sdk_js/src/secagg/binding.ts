/**
 * Key binding, as edge_sdk/secagg/binding.py (its docstring states the trust model): an Ed25519
 * identity key, seeded by HKDF-SHA256(secret, label("identity", id)), signs
 * label("advertise", session, round, id, cipher pk, mask pk, split, seed commitments). The server stores only
 * sha256(secret) and cannot make these signatures. Ed25519 is `@noble/curves` on every platform
 * (WebCrypto's Ed25519 is not in every browser; signing is deterministic, so both SDKs agree byte
 * for byte); verification is RFC 8032's strict one (`zip215: false`), as OpenSSL's.
 */
import { ed25519 } from "@noble/curves/ed25519.js";

import type { CryptoBackend } from "./backend.js";
import { KEY_BYTES, hkdf } from "./keys.js";
import { type Scope, SecAggError, checkBytes, label } from "./labels.js";

export const SIGNATURE_BYTES = 64;

async function identitySeed(secret: string, deviceId: string, backend?: CryptoBackend): Promise<Uint8Array> {
  if (!secret) throw new SecAggError("an identity key needs the device's secret");
  return hkdf(new TextEncoder().encode(secret), label("identity", deviceId), KEY_BYTES, backend);
}

/** The 32-byte Ed25519 public key of the device with credential `secret` (recorded at enrolment). */
export async function identityPublicKey(secret: string, deviceId: string, backend?: CryptoBackend): Promise<Uint8Array> {
  return ed25519.getPublicKey(await identitySeed(secret, deviceId, backend));
}

/** The bytes a device signs to advertise its two X25519 public keys, its split and its seed
 * commitments (32 bytes per trained block) for `scope`. */
export function advertisementMessage(scope: Scope, deviceId: string, cipherPublic: Uint8Array,
  maskPublic: Uint8Array, split: number, commitments: Uint8Array): Uint8Array {
  if (!Number.isInteger(split) || split < 0 || commitments.byteLength === 0 || commitments.byteLength % KEY_BYTES !== 0) {
    throw new SecAggError(`an advertisement needs a split >= 0 and 32-byte commitments, got ${split}, ${commitments.byteLength} bytes`);
  }
  return label("advertise", scope.session, scope.round, deviceId, checkBytes("cipher public key", cipherPublic, KEY_BYTES),
    checkBytes("mask public key", maskPublic, KEY_BYTES), split, commitments);
}

/** The 64-byte Ed25519 signature binding the round keys, split and commitments to the device's credential. */
export async function signAdvertisement(secret: string, deviceId: string, scope: Scope, cipherPublic: Uint8Array,
  maskPublic: Uint8Array, split: number, commitments: Uint8Array, backend?: CryptoBackend): Promise<Uint8Array> {
  const message = advertisementMessage(scope, deviceId, cipherPublic, maskPublic, split, commitments);
  return ed25519.sign(message, await identitySeed(secret, deviceId, backend));
}

/** Throws SecAggError unless `signature` is the device's signature on this advertisement for `scope`. */
export function verifyAdvertisement(identityPublic: Uint8Array, deviceId: string, scope: Scope, cipherPublic: Uint8Array,
  maskPublic: Uint8Array, split: number, commitments: Uint8Array, signature: Uint8Array): void {
  const message = advertisementMessage(scope, deviceId, cipherPublic, maskPublic, split, commitments);
  let valid = false;
  try {
    valid = ed25519.verify(checkBytes("signature", signature, SIGNATURE_BYTES), message,
      checkBytes("identity public key", identityPublic, KEY_BYTES), { zip215: false });
  } catch (exc) {
    if (exc instanceof SecAggError) throw exc;
  }
  if (!valid) throw new SecAggError(`the key advertisement of ${JSON.stringify(deviceId)} is not signed by its identity key`);
}

/** UTF-8 byte order of ids, as Python's sorted(key=str.encode). */
function byBytes(a: string, b: string): number {
  const [x, y] = [new TextEncoder().encode(a), new TextEncoder().encode(b)];
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i]! - y[i]!;
  return x.length - y.length;
}

/** The bytes a device signs in the consistency round (Bonawitz et al. 2017, ConsistencyCheck): the
 * survivor set it was given, sorted by UTF-8 bytes, as edge_sdk/secagg/binding.py. */
export function survivorsMessage(scope: Scope, survivors: readonly string[]): Uint8Array {
  const ids = [...survivors].sort(byBytes);
  if (new Set(ids).size !== ids.length) throw new SecAggError("a survivor set names a device twice");
  return label("survivors", scope.session, scope.round, ids.length, ...ids);
}

/** The device's Ed25519 signature on the survivor set of `scope`. */
export async function signSurvivors(secret: string, deviceId: string, scope: Scope, survivors: readonly string[],
  backend?: CryptoBackend): Promise<Uint8Array> {
  return ed25519.sign(survivorsMessage(scope, survivors), await identitySeed(secret, deviceId, backend));
}

/** Throws SecAggError unless `signature` is `deviceId`'s on this survivor set of `scope`. */
export function verifySurvivors(identityPublic: Uint8Array, deviceId: string, scope: Scope, survivors: readonly string[],
  signature: Uint8Array): void {
  let valid = false;
  try {
    valid = ed25519.verify(checkBytes("signature", signature, SIGNATURE_BYTES), survivorsMessage(scope, survivors),
      checkBytes("identity public key", identityPublic, KEY_BYTES), { zip215: false });
  } catch (exc) {
    if (exc instanceof SecAggError) throw exc;
  }
  if (!valid) throw new SecAggError(`${JSON.stringify(deviceId)} did not sign this survivor set`);
}
