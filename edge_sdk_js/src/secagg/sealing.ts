/**
 * Share encryption, as edge_sdk/secagg/sealing.py: AES-256-GCM under the pair's share key, with
 * associated data label("share-ad", session, round, sender, receiver) and a random 12-byte nonce;
 * 94 bytes: nonce | ciphertext of (seed share | mask-key share) | tag. Sizes are checked first.
 */
import { type CryptoBackend, randomBytes, selectBackend } from "./backend.js";
import { KEY_BYTES } from "./keys.js";
import { type Scope, SecAggError, checkBytes, concat, label } from "./labels.js";
import { SHARE_BYTES } from "./shamir.js";

export const NONCE_BYTES = 12;
export const SEALED_BYTES = NONCE_BYTES + 2 * SHARE_BYTES + 16;

function associated(scope: Scope, sender: string, receiver: string): Uint8Array {
  if (sender === receiver) throw new SecAggError("a device does not seal shares for itself");
  return label("share-ad", scope.session, scope.round, sender, receiver);
}

/** `sender`'s shares for `receiver`, sealed. `nonce` is for test vectors only. */
export async function sealShares(key: Uint8Array, scope: Scope, sender: string, receiver: string, seedShare: Uint8Array,
  maskKeyShare: Uint8Array, options: { nonce?: Uint8Array; backend?: CryptoBackend } = {}): Promise<Uint8Array> {
  const plaintext = concat([checkBytes("seed share", seedShare, SHARE_BYTES),
    checkBytes("mask key share", maskKeyShare, SHARE_BYTES)]);
  const nonce = options.nonce === undefined ? randomBytes(NONCE_BYTES) : checkBytes("nonce", options.nonce, NONCE_BYTES);
  const b = options.backend ?? (await selectBackend());
  const sealed = await b.aesGcmSeal(checkBytes("share key", key, KEY_BYTES), nonce, plaintext,
    associated(scope, sender, receiver));
  return concat([nonce, sealed]);
}

/** [seed share, mask-key share] from `sealed`; throws SecAggError unless `sender` sealed it for `receiver` in `scope`. */
export async function openShares(key: Uint8Array, scope: Scope, sender: string, receiver: string, sealed: Uint8Array,
  backend?: CryptoBackend): Promise<[Uint8Array, Uint8Array]> {
  checkBytes("sealed shares", sealed, SEALED_BYTES);
  const b = backend ?? (await selectBackend());
  const ad = associated(scope, sender, receiver);
  let plaintext: Uint8Array;
  try {
    plaintext = await b.aesGcmOpen(checkBytes("share key", key, KEY_BYTES), sealed.subarray(0, NONCE_BYTES),
      sealed.subarray(NONCE_BYTES), ad);
  } catch {
    throw new SecAggError(`the shares from ${JSON.stringify(sender)} to ${JSON.stringify(receiver)} do not open: `
      + "altered, or not for this pair, session and round");
  }
  return [plaintext.slice(0, SHARE_BYTES), plaintext.slice(SHARE_BYTES)];
}
