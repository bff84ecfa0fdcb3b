/**
 * Share encryption, as edge_sdk/secagg/sealing.py: AES-256-GCM under the pair's share key, with
 * associated data label("share-ad", session, round, sender, receiver) and a random 12-byte nonce;
 * 28 + 33 (m + 1) bytes for a sender that trained m blocks: nonce | ciphertext of (seed share of each
 * trained block, in block order | mask-key share) | tag (94 for one block). Sizes are checked first.
 */
import { type CryptoBackend, randomBytes, selectBackend } from "./backend.js";
import { KEY_BYTES } from "./keys.js";
import { type Scope, SecAggError, checkBytes, concat, label } from "./labels.js";
import { SHARE_BYTES } from "./shamir.js";

export const NONCE_BYTES = 12;
export const SEALED_BYTES = NONCE_BYTES + 2 * SHARE_BYTES + 16;

/** The size of the sealed shares of a sender that trained `blocks` blocks. */
export function sealedBytes(blocks: number): number {
  return NONCE_BYTES + (blocks + 1) * SHARE_BYTES + 16;
}

function associated(scope: Scope, sender: string, receiver: string): Uint8Array {
  if (sender === receiver) throw new SecAggError("a device does not seal shares for itself");
  return label("share-ad", scope.session, scope.round, sender, receiver);
}

/** `sender`'s shares of its blocks' seeds (block order) and of its mask key for `receiver`, sealed.
 * `nonce` is for test vectors only. */
export async function sealShares(key: Uint8Array, scope: Scope, sender: string, receiver: string, seedShares: Uint8Array[],
  maskKeyShare: Uint8Array, options: { nonce?: Uint8Array; backend?: CryptoBackend } = {}): Promise<Uint8Array> {
  if (seedShares.length === 0) throw new SecAggError("a sender seals the share of at least one block's seed");
  const plaintext = concat([...seedShares.map((s) => checkBytes("seed share", s, SHARE_BYTES)),
    checkBytes("mask key share", maskKeyShare, SHARE_BYTES)]);
  const nonce = options.nonce === undefined ? randomBytes(NONCE_BYTES) : checkBytes("nonce", options.nonce, NONCE_BYTES);
  const b = options.backend ?? (await selectBackend());
  const sealed = await b.aesGcmSeal(checkBytes("share key", key, KEY_BYTES), nonce, plaintext,
    associated(scope, sender, receiver));
  return concat([nonce, sealed]);
}

/** [seed share of each of the sender's `blocks` trained blocks, mask-key share] from `sealed`; throws
 * SecAggError unless `sender` sealed it for `receiver` in `scope`. */
export async function openShares(key: Uint8Array, scope: Scope, sender: string, receiver: string, sealed: Uint8Array,
  blocks = 1, backend?: CryptoBackend): Promise<[Uint8Array[], Uint8Array]> {
  checkBytes("sealed shares", sealed, sealedBytes(blocks));
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
  const shares: Uint8Array[] = [];
  for (let at = 0; at < plaintext.length; at += SHARE_BYTES) shares.push(plaintext.slice(at, at + SHARE_BYTES));
  return [shares.slice(0, -1), shares[shares.length - 1]!];
}
