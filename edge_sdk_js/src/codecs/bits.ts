/** b-bit codes <-> bytes, as edge_sdk/codecs/bits.py: element i takes bits [i*b, (i+1)*b), least significant first. */

export function packedSize(count: number, bits: number): number {
  return Math.ceil((count * bits) / 8);
}

export function pack(codes: Uint8Array, bits: number): Uint8Array {
  if (bits === 8) return codes.slice();
  const out = new Uint8Array(packedSize(codes.length, bits));
  let bit = 0;
  for (let i = 0; i < codes.length; i++, bit += bits) {
    const v = codes[i]!;
    const at = bit >>> 3, shift = bit & 7;
    out[at]! |= (v << shift) & 0xff;
    if (shift + bits > 8) out[at + 1]! |= v >>> (8 - shift);
  }
  return out;
}

export function unpack(body: Uint8Array, count: number, bits: number): Uint8Array {
  if (bits === 8) return body.slice(0, count);
  const out = new Uint8Array(count);
  const mask = (1 << bits) - 1;
  let bit = 0;
  for (let i = 0; i < count; i++, bit += bits) {
    const at = bit >>> 3, shift = bit & 7;
    let v = body[at]! >>> shift;
    if (shift + bits > 8) v |= body[at + 1]! << (8 - shift);
    out[i] = v & mask;
  }
  return out;
}
