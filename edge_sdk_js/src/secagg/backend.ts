/**
 * The primitives under the secure-aggregation blocks, from WebCrypto where the platform has it and
 * from the audited `@noble/*` libraries where it does not (a page on plain http has no
 * `crypto.subtle`). Both give the same bytes: X25519 (RFC 7748), HKDF-SHA256 with an empty salt
 * (RFC 5869), the AES-256-CTR keystream from a zero counter block (the counter in the last 8
 * bytes), AES-256-GCM with a 16-byte tag appended.
 */
import { ctr, gcm } from "@noble/ciphers/aes.js";
import { x25519 } from "@noble/curves/ed25519.js";
import { hkdf } from "@noble/hashes/hkdf.js";
import { sha256 } from "@noble/hashes/sha2.js";

import { SecAggError, concat } from "./labels.js";

export interface CryptoBackend {
  readonly name: "webcrypto" | "noble";
  x25519PublicKey(privateKey: Uint8Array): Promise<Uint8Array>;
  /** X25519(privateKey, publicKey); throws SecAggError for a small-order public key. */
  x25519(privateKey: Uint8Array, publicKey: Uint8Array): Promise<Uint8Array>;
  hkdf(ikm: Uint8Array, info: Uint8Array, length: number): Promise<Uint8Array>;
  /** `bytes` bytes of the AES-256-CTR keystream of `key`, from its 16-byte block `block` on (the
   * counter block: zeros with `block` big-endian in the last 8 bytes; 0 is the stream's start). */
  aesCtrKeystream(key: Uint8Array, bytes: number, block?: number): Promise<Uint8Array>;
  aesGcmSeal(key: Uint8Array, nonce: Uint8Array, plaintext: Uint8Array, associated: Uint8Array): Promise<Uint8Array>;
  /** The plaintext; throws SecAggError if the tag does not verify. */
  aesGcmOpen(key: Uint8Array, nonce: Uint8Array, sealed: Uint8Array, associated: Uint8Array): Promise<Uint8Array>;
}

/** The counter block of the keystream's 16-byte block `block` (a safe integer). */
function counterBlock(block = 0): Uint8Array<ArrayBuffer> {
  if (!Number.isSafeInteger(block) || block < 0) throw new SecAggError(`a keystream block is a safe integer >= 0, got ${block}`);
  const out = new Uint8Array(16);
  new DataView(out.buffer).setBigUint64(8, BigInt(block));
  return out;
}
const SMALL_ORDER = "key agreement failed: the public key has small order";

/** A copy backed by a plain ArrayBuffer, the type WebCrypto's BufferSource takes. */
function own(data: Uint8Array): Uint8Array<ArrayBuffer> {
  return new Uint8Array(data);
}

export const nobleBackend: CryptoBackend = {
  name: "noble",
  async x25519PublicKey(privateKey) {
    return x25519.getPublicKey(privateKey);
  },
  async x25519(privateKey, publicKey) {
    try {
      return x25519.getSharedSecret(privateKey, publicKey);
    } catch {
      throw new SecAggError(SMALL_ORDER);
    }
  },
  async hkdf(ikm, info, length) {
    return hkdf(sha256, ikm, undefined, info, length);
  },
  async aesCtrKeystream(key, bytes, block) {
    return ctr(key, counterBlock(block)).encrypt(new Uint8Array(bytes));
  },
  async aesGcmSeal(key, nonce, plaintext, associated) {
    return gcm(key, nonce, associated).encrypt(plaintext);
  },
  async aesGcmOpen(key, nonce, sealed, associated) {
    try {
      return gcm(key, nonce, associated).decrypt(sealed);
    } catch {
      throw new SecAggError("AES-GCM tag does not verify");
    }
  },
};

// PKCS#8 wrapping of a raw X25519 private key (RFC 8410): WebCrypto imports X25519 private keys
// only as PKCS#8 or JWK.
const PKCS8_X25519 = Uint8Array.from([0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x04,
  0x22, 0x04, 0x20]);

function base64url(text: string): Uint8Array {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const bin = atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

/** The same primitives on a platform's `crypto.subtle`. */
export function webCryptoBackend(subtle: SubtleCrypto): CryptoBackend {
  const x25519Private = (privateKey: Uint8Array, extractable: boolean) =>
    subtle.importKey("pkcs8", own(concat([PKCS8_X25519, privateKey])), { name: "X25519" }, extractable, ["deriveBits"]);
  return {
    name: "webcrypto",
    async x25519PublicKey(privateKey) {
      const jwk = await subtle.exportKey("jwk", await x25519Private(privateKey, true));
      return base64url(jwk.x ?? "");
    },
    async x25519(privateKey, publicKey) {
      const mine = await x25519Private(privateKey, false);
      const theirs = await subtle.importKey("raw", own(publicKey), { name: "X25519" }, false, []);
      try {
        return new Uint8Array(await subtle.deriveBits({ name: "X25519", public: theirs }, mine, 256));
      } catch {
        throw new SecAggError(SMALL_ORDER);
      }
    },
    async hkdf(ikm, info, length) {
      const key = await subtle.importKey("raw", own(ikm), "HKDF", false, ["deriveBits"]);
      const params = { name: "HKDF", hash: "SHA-256", salt: new Uint8Array(0), info: own(info) };
      return new Uint8Array(await subtle.deriveBits(params, key, length * 8));
    },
    async aesCtrKeystream(key, bytes, block) {
      const k = await subtle.importKey("raw", own(key), "AES-CTR", false, ["encrypt"]);
      const params = { name: "AES-CTR", counter: counterBlock(block), length: 64 };
      return new Uint8Array(await subtle.encrypt(params, k, new Uint8Array(bytes)));
    },
    async aesGcmSeal(key, nonce, plaintext, associated) {
      const k = await subtle.importKey("raw", own(key), "AES-GCM", false, ["encrypt"]);
      const params = { name: "AES-GCM", iv: own(nonce), additionalData: own(associated), tagLength: 128 };
      return new Uint8Array(await subtle.encrypt(params, k, own(plaintext)));
    },
    async aesGcmOpen(key, nonce, sealed, associated) {
      const k = await subtle.importKey("raw", own(key), "AES-GCM", false, ["decrypt"]);
      const params = { name: "AES-GCM", iv: own(nonce), additionalData: own(associated), tagLength: 128 };
      try {
        return new Uint8Array(await subtle.decrypt(params, k, own(sealed)));
      } catch {
        throw new SecAggError("AES-GCM tag does not verify");
      }
    },
  };
}

let selected: Promise<CryptoBackend> | undefined;

/**
 * WebCrypto when `crypto.subtle` exists and does X25519 (checked once by importing a key), else
 * `@noble/*`. Every function of this module takes a backend; this is its default.
 */
export function selectBackend(): Promise<CryptoBackend> {
  selected ??= (async () => {
    const subtle = globalThis.crypto?.subtle;
    if (!subtle) return nobleBackend;
    try {
      await webCryptoBackend(subtle).x25519PublicKey(new Uint8Array(32).fill(1));
      return webCryptoBackend(subtle);
    } catch {
      return nobleBackend;
    }
  })();
  return selected;
}

/** `count` bytes from the platform's cryptographic generator (present on plain http too). */
export function randomBytes(count: number): Uint8Array {
  return globalThis.crypto.getRandomValues(new Uint8Array(count));
}
