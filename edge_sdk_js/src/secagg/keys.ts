/**
 * Key agreement and derivation, as edge_sdk/secagg/keys.py: X25519 key pairs, their agreement,
 * and HKDF-SHA256 (empty salt) with one label per purpose: the pair's share key for a round, the
 * pair's mask seed for a block in a round, a device's self-mask seed for a block.
 */
import { type CryptoBackend, randomBytes, selectBackend } from "./backend.js";
import { type Scope, checkBytes, label, ordered } from "./labels.js";

export const KEY_BYTES = 32;

export interface KeyPair {
  readonly privateKey: Uint8Array;
  readonly publicKey: Uint8Array;
}

/** A fresh X25519 key pair (32 random bytes from the platform's generator, and their public key). */
export async function generateKeyPair(backend?: CryptoBackend): Promise<KeyPair> {
  const privateKey = randomBytes(KEY_BYTES);
  return { privateKey, publicKey: await publicKey(privateKey, backend) };
}

/** The public key of a raw 32-byte X25519 private key. */
export async function publicKey(privateKey: Uint8Array, backend?: CryptoBackend): Promise<Uint8Array> {
  const b = backend ?? (await selectBackend());
  return b.x25519PublicKey(checkBytes("private key", privateKey, KEY_BYTES));
}

/** X25519(privateKey, peerPublic): the 32-byte shared secret; refuses small-order public keys. */
export async function agree(privateKey: Uint8Array, peerPublic: Uint8Array, backend?: CryptoBackend): Promise<Uint8Array> {
  const b = backend ?? (await selectBackend());
  return b.x25519(checkBytes("private key", privateKey, KEY_BYTES), checkBytes("public key", peerPublic, KEY_BYTES));
}

/** HKDF-SHA256 of `ikm` with an empty salt and `info`. */
export async function hkdf(ikm: Uint8Array, info: Uint8Array, length = KEY_BYTES, backend?: CryptoBackend): Promise<Uint8Array> {
  return (backend ?? (await selectBackend())).hkdf(ikm, info, length);
}

/** The AES-256-GCM key of devices `a` and `b` for `scope`, from their `c` agreement. */
export async function shareKey(shared: Uint8Array, scope: Scope, a: string, b: string,
  backend?: CryptoBackend): Promise<Uint8Array> {
  const [low, high] = ordered(a, b);
  const info = label("share-key", scope.session, scope.round, low, high);
  return hkdf(checkBytes("shared secret", shared, KEY_BYTES), info, KEY_BYTES, backend);
}

/** The seed of the pairwise mask of `a` and `b` on `block`, from their `s` agreement. */
export async function pairMaskSeed(shared: Uint8Array, scope: Scope, block: number, a: string, b: string,
  backend?: CryptoBackend): Promise<Uint8Array> {
  const [low, high] = ordered(a, b);
  const info = label("pair-mask", scope.session, scope.round, block, low, high);
  return hkdf(checkBytes("shared secret", shared, KEY_BYTES), info, KEY_BYTES, backend);
}

/** The seed of `deviceId`'s self mask on `block`, from its random 32-byte seed. */
export async function selfMaskSeed(seed: Uint8Array, scope: Scope, block: number, deviceId: string,
  backend?: CryptoBackend): Promise<Uint8Array> {
  const info = label("self-mask", scope.session, scope.round, block, deviceId);
  return hkdf(checkBytes("self-mask seed", seed, KEY_BYTES), info, KEY_BYTES, backend);
}

/** The commitment to `deviceId`'s seed b_u^k of `block` (signed in its advertisement): HKDF-SHA256 of
 * the seed with label("seed-commit", session, round, block, id), as edge_sdk/secagg/keys.py. */
export async function seedCommitment(seed: Uint8Array, scope: Scope, block: number, deviceId: string,
  backend?: CryptoBackend): Promise<Uint8Array> {
  const info = label("seed-commit", scope.session, scope.round, block, deviceId);
  return hkdf(checkBytes("self-mask seed", seed, KEY_BYTES), info, KEY_BYTES, backend);
}
