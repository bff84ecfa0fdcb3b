/**
 * Transfer codecs (docs/protocol.md, "Codecs"), the same records as edge_sdk/codecs:
 * `none`, `zlib`, `shuffle` (lossless); `float16`, `int8`, `sr1`..`sr8`, `eden1`..`eden4` (lossy, float32).
 */
export type { Codec, EncodeOptions } from "./base.js";
export { CodecError, MAX_BYTES } from "./record.js";
export { CODECS, codec, decode, decodeBytes, encodeBytes, float32Values, linearCodes, type CodecParams } from "./registry.js";
export { ErrorFeedback } from "./feedback.js";
export { CENTROIDS, NMSE } from "./eden.js";
export { seededBytes } from "./stream.js";
