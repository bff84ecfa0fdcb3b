// A test's record of the words a device encodes in a secure round, before it masks them: what the
// attack test (secagg-attack.test.mjs) holds the server's recording against. The server never sees
// them. `recordEncodings` wraps the SDK's own classes (BlockEncoder and DeviceRound, passed in: a
// Node process's modules or a tab's) for the process or page it runs in; nothing of the device's
// behaviour changes, and no device does it unless a test started it so (test/recording-device.mjs,
// the attack test's tab).

/** The words of each block kept besides its weight word: its first HEAD coordinates (tests/secagg_attack.py's HEAD). */
export const HEAD = 4096;

/**
 * From now on, call `sink(record)` once for each block a DeviceRound masks: `{ device, round, block,
 * bits, count, head, weight }`, its first HEAD words, the weight word and how many words (the weight
 * word's included) the block's encoding had. Returns a function that puts the SDK's methods back.
 */
export function recordEncodings(BlockEncoder, DeviceRound, sink) {
  const { values, weightWord } = BlockEncoder.prototype;
  const { maskBlock } = DeviceRound.prototype;
  let current = null;
  BlockEncoder.prototype.values = async function (...args) {
    const words = await values.apply(this, args);
    if (current !== null) {
      current.head.push(...Array.from(words.subarray(0, Math.max(0, HEAD - current.head.length))));
      current.count += words.length;
    }
    return words;
  };
  BlockEncoder.prototype.weightWord = async function (...args) {
    const word = await weightWord.apply(this, args);
    if (current !== null) Object.assign(current, { weight: word[0], count: current.count + 1 });
    return word;
  };
  DeviceRound.prototype.maskBlock = async function (block, ...rest) {
    const record = { device: this.deviceId, round: this.scope.round, block, bits: this.fixed.ringBits, count: 0, head: [], weight: null };
    current = record;
    try {
      const out = await maskBlock.call(this, block, ...rest);
      sink(record);
      return out;
    } finally {
      current = null;
    }
  };
  return () => {
    Object.assign(BlockEncoder.prototype, { values, weightWord });
    DeviceRound.prototype.maskBlock = maskBlock;
  };
}
