/**
 * Secure aggregation's building blocks (SecAgg+), the same functions and bytes as Python's
 * edge_sdk/secagg: labels, X25519 and HKDF, key binding, mask expansion, Shamir shares, share
 * sealing, fixed point, the neighbour graph. WebCrypto where present, `@noble/*` otherwise.
 *
 * A separate entry point (`dist/secagg/index.js`), not re-exported by the SDK's index: a page that
 * loads the SDK does not fetch `@noble/curves`, `@noble/ciphers` or `shamir-secret-sharing` (its
 * import map names them only once secure aggregation is wired into the device).
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
