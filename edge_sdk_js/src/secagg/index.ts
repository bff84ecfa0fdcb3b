/**
 * Secure aggregation's building blocks (SecAgg+), the same functions and bytes as Python's
 * edge_sdk/secagg: labels, X25519 and HKDF, key binding, mask expansion, Shamir shares, share
 * sealing, fixed point, the neighbour graph. WebCrypto where present, `@noble/*` otherwise.
 *
 * A separate entry point (`dist/secagg/index.js`), not re-exported by the SDK's index: the device
 * loads it (with src/secagg/exchange.ts, by a dynamic import) only when a train instruction names
 * `secagg_session`, so a device that takes no part in secure rounds never loads `@noble/curves`,
 * `@noble/ciphers` or `shamir-secret-sharing`. Also here: a block's vector (layout.ts) and one
 * device's side of a round (round.ts).
 */
export * from "./labels.js";
export * from "./backend.js";
export * from "./keys.js";
export * from "./binding.js";
export * from "./masks.js";
export * from "./shamir.js";
export * from "./sealing.js";
export * from "./fixedpoint.js";
export * from "./graph.js";
export * from "./layout.js";
export * from "./round.js";
