/**
 * The messages of the wire protocol (docs/protocol.md, "Messages") and their codec: msgpack maps
 * with `"t"` (type) and `"v"` (version) plus the fields, every field on the wire, none extra.
 * `decode` trusts nothing: the size is checked before parsing, msgpack runs with length limits,
 * and every field is checked for presence, type and value constraints. Failures raise
 * `ProtocolError` and nothing else.
 */
import { Decoder, Encoder } from "@msgpack/msgpack";
import { ErrorCode, ProtocolError } from "./errors.js";

export const PROTOCOL_VERSION = 4;
/** The longest probe step a hello may claim, seconds (`Hello.probe_step_s`). */
export const PROBE_STEP_MAX_S = 60;
export const PHASES = ["train", "evaluate", "compare"] as const;
/** The phases whose report carries tensors (an `update` transfer); the others report metrics only. */
export const TENSOR_PHASES: ReadonlySet<string> = new Set(["train"]);
export const SELECTIONS = ["tail", "rows", "channels", "adapters"] as const;
export const TRAIN_GRAPH_KEY = "train_graph_id";

export type Scalar = string | number | boolean;
export type Pair = [number, number];

/** Bounds every decoder enforces; the receiver's limits decide (docs/protocol.md, "Limits"). */
export interface Limits {
  maxFrameBytes: number;
  maxMessageBytes: number;
  maxTransferBytes: number;
  maxTensorBytes: number;
  maxRank: number;
  maxDim: number;
  maxItems: number;
  maxStrLen: number;
}

export function makeLimits(overrides: Partial<Limits> = {}): Limits {
  const maxFrameBytes = overrides.maxFrameBytes ?? 1 << 20;
  return {
    maxFrameBytes,
    maxMessageBytes: overrides.maxMessageBytes ?? maxFrameBytes + (64 << 10),
    maxTransferBytes: overrides.maxTransferBytes ?? 2 ** 30,
    maxTensorBytes: overrides.maxTensorBytes ?? 2 ** 30,
    maxRank: overrides.maxRank ?? 8,
    maxDim: overrides.maxDim ?? 2 ** 31,
    maxItems: overrides.maxItems ?? 100_000,
    maxStrLen: overrides.maxStrLen ?? 4096,
  };
}

export const DEFAULT_LIMITS: Limits = makeLimits();

export interface Hello {
  t: "hello"; device_id: string; token: string; budget_bytes: number; cores: number; runtimes: string[];
  num_samples: number; device_class: string; labels: Record<string, string>; resume_round: number;
  rows: Record<string, number[]>;
  /** Extension fields a strategy declares (docs/protocol.md, "Extension fields"): `namespace.name` -> value. */
  ext: Record<string, unknown>;
  /** Optional (left out while `[]`): one sample's shape, as the device's data declares it. */
  input_shape?: number[];
  /** Optional (left out while -1): the data's label count. */
  num_classes?: number;
  /** Optional (left out while 0): the seconds one step of the SDK's probe took (src/backends/probe.ts). */
  probe_step_s?: number;
}
export interface Welcome {
  t: "welcome"; device_id: string; role: string; split: number; num_blocks: number; chunks: Pair[];
  model: string; model_version: number; batch_size: number; local_steps: number; config: Record<string, Scalar>;
}
export interface Instruction {
  t: "instruction"; round: number; phase: string; model_version: number; split: number; chunk_ids: string[];
  model_id: string; selection: string; broadcast_id: string; local_steps: number; lr: number; deadline_s: number;
  config: Record<string, Scalar>;
  /** Optional (left out while `{}`): payload id -> sha256 of each payload named (docs/protocol.md, "Held payloads"). */
  digests?: Record<string, string>;
}
export interface Fetch {
  t: "fetch"; round: number; payload_id: string; offset: number;
  /** Optional (left out while `""`): the sha256 of the payload this device holds; the server then sends none of it. */
  held?: string;
}
export interface TransferBegin {
  t: "transfer_begin"; transfer_id: string; kind: string; total_size: number; sha256: string; frame_size: number;
  offset: number; meta: Record<string, Scalar>;
}
export interface TransferFrame { t: "transfer_frame"; transfer_id: string; offset: number; data: Uint8Array }
export interface TransferEnd { t: "transfer_end"; transfer_id: string; sha256: string }
export interface Report {
  t: "report"; round: number; phase: string; num_samples: number; trained: Pair; transfer_id: string;
  metrics: Record<string, Scalar>;
  /** Optional (left out while `-1`): the instruction's `model_version`, echoed (docs/protocol.md, "Model versions"). */
  model_version?: number;
}
export interface Ack { t: "ack"; round: number; accepted: boolean; reason: string; phase: string }
export interface ErrorMsg { t: "error"; code: string; message: string }
export interface Bye { t: "bye"; reason: string }
export interface Resume { t: "resume"; transfer_id: string; offset: number }

/** The instruction `config` key that makes a train instruction a secure one (its value: the round's
 * scope, `Scope.session`); docs/protocol.md, "Secure aggregation". */
export const SECAGG_KEY = "secagg_session";
/** Device -> server, SecAgg+ round 0 (AdvertiseKeys): the round's two X25519 public keys and the
 * commitments to its blocks' seeds (32 bytes per trained block), signed with its split. */
export interface SecAggKeys {
  t: "secagg_keys"; round: number; cipher_public: Uint8Array; mask_public: Uint8Array; signature: Uint8Array;
  commitments: Uint8Array;
}
/** Server -> device: the key cohort, the device's neighbours' advertisements and the round's fixed point. */
export interface SecAggPeers {
  t: "secagg_peers"; round: number; graph_seed: Uint8Array; degree: number; members: string[];
  cipher_keys: Record<string, Uint8Array>; mask_keys: Record<string, Uint8Array>; signatures: Record<string, Uint8Array>;
  identities: Record<string, Uint8Array>; splits: Record<string, Scalar>; clip: number; frac_bits: number; ring_bits: number;
  cohort: number; weight_scale: number; threshold: number;
  noise_sigma: Record<string, Scalar>; noise_survivors: Record<string, Scalar>;
  /** Per neighbour, its signed seed commitments; the round's t (the fewest devices a revealed sum holds). */
  commitments: Record<string, Uint8Array>; min_survivors: number;
  /** A compressed round's q-bit values and spread k (0 and 0: the 32-bit ring; src/secagg/fixedpoint.ts `Compression`). */
  value_bits: number; value_spread: number;
  /** This device's aggregation weight in [0, 1], fixed by the server from its registered samples (-1: absent, a
   * server that predates it: the device takes min(1, num_samples / weight_scale)). */
  weight: number;
}
/** Device -> server, SecAgg+ round 1 (ShareKeys): per neighbour, its sealed shares (28 + 33 (m + 1) bytes for m trained blocks). */
export interface SecAggShares { t: "secagg_shares"; round: number; sealed: Record<string, Uint8Array> }
/** Server -> device: the sealed shares the neighbours sent it (sender -> 28 + 33 (m + 1) bytes). */
export interface SecAggInbox { t: "secagg_inbox"; round: number; sealed: Record<string, Uint8Array> }
/** Server -> device, SecAgg+ round 3 (Unmasking): which neighbours uploaded and which did not, and
 * the blocks whose seeds the server asks for (each one's survivors reach the round's t). */
export interface SecAggUnmask {
  t: "secagg_unmask"; round: number; survivors: string[]; dropped: string[]; blocks: number[];
  /** The consistency round (Bonawitz et al. 2017): the survivor set to sign, then the signers' signatures on it. */
  survivor_set: string[]; signatures: Record<string, Uint8Array>;
}
/** Device -> server: its shares of each survivor's self-mask seeds of the blocks asked (33 bytes each, in
 * block order) and of each dropped device's mask key. */
export interface SecAggReveal {
  t: "secagg_reveal"; round: number; seed_shares: Record<string, Uint8Array>; key_shares: Record<string, Uint8Array>;
  /** The answer to the consistency round's first request: the device's signature on the survivor set, no shares. */
  consent: Uint8Array;
}

export type Message =
  | Hello | Welcome | Instruction | Fetch | TransferBegin | TransferFrame | TransferEnd | Report | Ack | ErrorMsg
  | Bye | Resume | SecAggKeys | SecAggPeers | SecAggShares | SecAggInbox | SecAggUnmask | SecAggReveal;

type Kind = "str" | "int" | "float" | "bool" | "bytes" | "list_str" | "list_int" | "pair" | "list_pair" | "dict_str"
  | "dict_scalar" | "dict_ints" | "dict_bytes" | "ext";

/** Field names and kinds of every message, in wire order (the Python dataclasses' order). */
const SCHEMAS: Record<Message["t"], [string, Kind][]> = {
  hello: [["device_id", "str"], ["token", "str"], ["budget_bytes", "int"], ["cores", "int"],
    ["runtimes", "list_str"], ["num_samples", "int"], ["device_class", "str"], ["labels", "dict_str"],
    ["resume_round", "int"], ["rows", "dict_ints"], ["ext", "ext"]],
  welcome: [["device_id", "str"], ["role", "str"], ["split", "int"], ["num_blocks", "int"], ["chunks", "list_pair"],
    ["model", "str"], ["model_version", "int"], ["batch_size", "int"], ["local_steps", "int"],
    ["config", "dict_scalar"]],
  instruction: [["round", "int"], ["phase", "str"], ["model_version", "int"], ["split", "int"],
    ["chunk_ids", "list_str"], ["model_id", "str"], ["selection", "str"], ["broadcast_id", "str"],
    ["local_steps", "int"], ["lr", "float"], ["deadline_s", "float"], ["config", "dict_scalar"]],
  fetch: [["round", "int"], ["payload_id", "str"], ["offset", "int"]],
  transfer_begin: [["transfer_id", "str"], ["kind", "str"], ["total_size", "int"], ["sha256", "str"],
    ["frame_size", "int"], ["offset", "int"], ["meta", "dict_scalar"]],
  transfer_frame: [["transfer_id", "str"], ["offset", "int"], ["data", "bytes"]],
  transfer_end: [["transfer_id", "str"], ["sha256", "str"]],
  report: [["round", "int"], ["phase", "str"], ["num_samples", "int"], ["trained", "pair"], ["transfer_id", "str"],
    ["metrics", "dict_scalar"]],
  ack: [["round", "int"], ["accepted", "bool"], ["reason", "str"], ["phase", "str"]],
  error: [["code", "str"], ["message", "str"]],
  bye: [["reason", "str"]],
  resume: [["transfer_id", "str"], ["offset", "int"]],
  secagg_keys: [["round", "int"], ["cipher_public", "bytes"], ["mask_public", "bytes"], ["signature", "bytes"]],
  secagg_peers: [["round", "int"], ["graph_seed", "bytes"], ["degree", "int"], ["members", "list_str"],
    ["cipher_keys", "dict_bytes"], ["mask_keys", "dict_bytes"], ["signatures", "dict_bytes"], ["identities", "dict_bytes"],
    ["splits", "dict_scalar"], ["clip", "float"], ["frac_bits", "int"], ["ring_bits", "int"], ["cohort", "int"],
    ["weight_scale", "float"], ["threshold", "int"]],
  secagg_shares: [["round", "int"], ["sealed", "dict_bytes"]],
  secagg_inbox: [["round", "int"], ["sealed", "dict_bytes"]],
  secagg_unmask: [["round", "int"], ["survivors", "list_str"], ["dropped", "list_str"]],
  secagg_reveal: [["round", "int"], ["seed_shares", "dict_bytes"], ["key_shares", "dict_bytes"]],
};

/** Sizes of secure aggregation's values (src/secagg/), repeated so that the codec loads no cryptography. */
const KEY_BYTES = 32, SIGNATURE_BYTES = 64, SEALED_BYTES = 94, SHARE_BYTES = 33, MAX_PEERS = 255, MAX_SECURE_BLOCKS = 255;

function checkIds(name: string, ids: Iterable<string>): void {
  for (const id of ids) require(id !== "", `${name} holds an empty device id`);
}

function checkSized(name: string, values: Record<string, Uint8Array>, size: number): void {
  const entries = Object.entries(values);
  require(entries.length <= MAX_PEERS, `${name} names ${entries.length} devices, more than ${MAX_PEERS}`);
  checkIds(name, Object.keys(values));
  for (const [key, value] of entries) require(value.byteLength === size, `${name}[${key.slice(0, 40)}] is ${value.byteLength} bytes, not ${size}`);
}

/** Each value is `base` + `step` m bytes for 0 <= m <= 255 (one per block a device trained). */
function checkMultiple(name: string, values: Record<string, Uint8Array>, base: number, step = SHARE_BYTES): void {
  const entries = Object.entries(values);
  require(entries.length <= MAX_PEERS, `${name} names ${entries.length} devices, more than ${MAX_PEERS}`);
  checkIds(name, Object.keys(values));
  for (const [key, value] of entries) {
    const extra = value.byteLength - base;
    require(extra >= 0 && extra <= step * MAX_SECURE_BLOCKS && extra % step === 0,
      `${name}[${key.slice(0, 40)}] is ${value.byteLength} bytes, not ${base} + ${step} m`);
  }
}

/** The value constraints of the secure-aggregation messages (Python's `SecAgg*.check`). */
function checkSecAgg(msg: SecAggKeys | SecAggPeers | SecAggShares | SecAggInbox | SecAggUnmask | SecAggReveal): void {
  const t = msg.t;
  require(msg.round >= 0, `${t}.round is negative`);
  switch (msg.t) {
    case "secagg_keys":
      require(msg.cipher_public.byteLength === KEY_BYTES, "secagg_keys.cipher_public is not 32 bytes");
      require(msg.mask_public.byteLength === KEY_BYTES, "secagg_keys.mask_public is not 32 bytes");
      require(msg.signature.byteLength === SIGNATURE_BYTES, "secagg_keys.signature is not 64 bytes");
      require(msg.commitments.byteLength % KEY_BYTES === 0 && msg.commitments.byteLength <= KEY_BYTES * MAX_SECURE_BLOCKS,
        "secagg_keys.commitments is not 32 bytes per block");
      break;
    case "secagg_peers":
      require(msg.graph_seed.byteLength === KEY_BYTES, "secagg_peers.graph_seed is not 32 bytes");
      require(Number.isInteger(msg.value_bits) && msg.value_bits >= 0 && msg.value_bits <= 24 && msg.value_bits !== 1
        && Number.isFinite(msg.value_spread) && msg.value_spread >= 0 && (msg.value_bits === 0) === (msg.value_spread === 0),
      "secagg_peers.value_bits and value_spread are not a compression (q in [2, 24], k > 0) or none");
      checkMultiple("secagg_peers.commitments", msg.commitments, 0, KEY_BYTES);
      require(Number.isInteger(msg.min_survivors) && msg.min_survivors >= 0 && msg.min_survivors <= MAX_PEERS,
        "secagg_peers.min_survivors is outside [0, 255]");
      checkIds("secagg_peers.members", msg.members);
      require(new Set(msg.members).size === msg.members.length, "secagg_peers.members repeats a device");
      for (const [name, size] of [["cipher_keys", KEY_BYTES], ["mask_keys", KEY_BYTES], ["signatures", SIGNATURE_BYTES],
        ["identities", KEY_BYTES]] as const) checkSized(`secagg_peers.${name}`, msg[name], size);
      require(Object.values(msg.splits).every((v) => Number.isInteger(v) && (v as number) >= 0), "secagg_peers.splits holds a non-index");
      require(msg.clip > 0, "secagg_peers.clip is not positive");
      require(msg.degree >= 1 && msg.degree <= MAX_PEERS - 1, "secagg_peers.degree is outside [1, 254]");
      require(msg.frac_bits >= 0 && msg.frac_bits <= 60 && msg.ring_bits >= 1 && msg.ring_bits <= 32, "secagg_peers has a bad fixed point");
      require(msg.cohort >= 2 && msg.threshold >= 2, "secagg_peers.cohort or threshold is below 2");
      require(msg.weight_scale > 0, "secagg_peers.weight_scale is not positive");
      require(msg.weight === -1 || (msg.weight >= 0 && msg.weight <= 1), "secagg_peers.weight is outside [0, 1]");
      require(Object.keys(msg.noise_sigma).length === Object.keys(msg.noise_survivors).length
        && Object.keys(msg.noise_sigma).every((b) => Object.hasOwn(msg.noise_survivors, b)), "secagg_peers.noise_* name different blocks");
      require(Object.values(msg.noise_sigma).every((v) => typeof v === "number" && Number.isFinite(v) && v >= 0),
        "secagg_peers.noise_sigma holds a value that is not a finite number >= 0");
      require(Object.values(msg.noise_survivors).every((v) => Number.isInteger(v) && (v as number) >= 1),
        "secagg_peers.noise_survivors holds a count below 1");
      break;
    case "secagg_shares": case "secagg_inbox":
      checkMultiple(`${t}.sealed`, msg.sealed, SEALED_BYTES);
      break;
    case "secagg_unmask":
      checkIds("secagg_unmask.survivors", msg.survivors);
      checkIds("secagg_unmask.dropped", msg.dropped);
      require(!msg.survivors.some((v) => msg.dropped.includes(v)), "secagg_unmask names a device as survivor and dropped");
      checkIds("secagg_unmask.survivor_set", msg.survivor_set);
      require(msg.survivor_set.length <= 1 << 16 && new Set(msg.survivor_set).size === msg.survivor_set.length,
        "secagg_unmask.survivor_set repeats a device");
      checkSized("secagg_unmask.signatures", msg.signatures, SIGNATURE_BYTES);
      require(msg.blocks.length <= 1 << 16 && msg.blocks.every((b) => Number.isInteger(b) && b >= 0)
        && new Set(msg.blocks).size === msg.blocks.length, "secagg_unmask.blocks is not a set of block indices");
      break;
    case "secagg_reveal":
      checkMultiple("secagg_reveal.seed_shares", msg.seed_shares, SHARE_BYTES);
      require(msg.consent.byteLength === 0 || msg.consent.byteLength === SIGNATURE_BYTES, "secagg_reveal.consent is not a 64-byte signature");
      require(msg.consent.byteLength === 0 || (Object.keys(msg.seed_shares).length === 0 && Object.keys(msg.key_shares).length === 0),
        "secagg_reveal gives shares with its consent");
      checkSized("secagg_reveal.key_shares", msg.key_shares, SHARE_BYTES);
      require(!Object.keys(msg.seed_shares).some((v) => Object.hasOwn(msg.key_shares, v)), "secagg_reveal gives both shares of one device");
      break;
  }
}

/** Optional fields (docs/protocol.md, "Optional fields"): left out of a message while they hold their
 * default, taken as the default when absent, so a peer that predates them exchanges it as before. */
const OPTIONAL: Partial<Record<Message["t"], [string, Kind, unknown][]>> = {
  hello: [["input_shape", "list_int", []], ["num_classes", "int", -1], ["probe_step_s", "float", 0]],
  instruction: [["digests", "dict_str", {}]],
  fetch: [["held", "str", ""]],
  report: [["model_version", "int", -1]],
  secagg_keys: [["commitments", "bytes", new Uint8Array(0)]],
  secagg_peers: [["noise_sigma", "dict_scalar", {}], ["noise_survivors", "dict_scalar", {}], ["commitments", "dict_bytes", {}],
    ["min_survivors", "int", 0], ["value_bits", "int", 0], ["value_spread", "float", 0], ["weight", "float", -1]],
  secagg_unmask: [["blocks", "list_int", []], ["survivor_set", "list_str", []], ["signatures", "dict_bytes", {}]],
  secagg_reveal: [["consent", "bytes", new Uint8Array(0)]],
};

function isDefault(value: unknown, fallback: unknown): boolean {
  return value === undefined || JSON.stringify(value) === JSON.stringify(fallback);
}

const SHA256_HEX = /^[0-9a-f]{64}$/;

function bad(where: string, what: string): ProtocolError {
  return new ProtocolError(ErrorCode.MALFORMED, `${where}: ${what}`);
}

function require(ok: boolean, message: string): void {
  if (!ok) throw new ProtocolError(ErrorCode.MALFORMED, message);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof Uint8Array)
    && !(value instanceof Map);
}

function checkStr(where: string, value: unknown, limits: Limits): string {
  if (typeof value !== "string") throw bad(where, `expected str, got ${typeof value}`);
  if (value.length > limits.maxStrLen) {
    throw new ProtocolError(ErrorCode.TOO_LARGE, `${where}: string of ${value.length} characters exceeds ${limits.maxStrLen}`);
  }
  return value;
}

function checkInt(where: string, value: unknown): number {
  if (typeof value === "bigint") {
    if (value < -(2n ** 63n) || value >= 2n ** 63n) throw bad(where, "integer outside the int64 range");
    return Number(value);
  }
  if (typeof value !== "number" || !Number.isInteger(value)) throw bad(where, `expected int, got ${typeof value}`);
  return value;
}

function checkFloat(where: string, value: unknown): number {
  if (typeof value === "bigint") return Number(value);
  if (typeof value !== "number") throw bad(where, `expected float, got ${typeof value}`);
  if (!Number.isFinite(value)) throw new ProtocolError(ErrorCode.NON_FINITE, `${where}: ${value} is not finite`);
  return value;
}

function checkItems(where: string, count: number, limits: Limits): void {
  if (count > limits.maxItems) {
    throw new ProtocolError(ErrorCode.TOO_LARGE, `${where}: ${count} entries exceed ${limits.maxItems}`);
  }
}

function checkMap(where: string, value: unknown, limits: Limits): [string, unknown][] {
  if (!isPlainObject(value)) throw bad(where, "expected a map");
  const entries = Object.entries(value);
  checkItems(where, entries.length, limits);
  for (const [key] of entries) checkStr(where, key, limits);
  return entries;
}

function checkPair(where: string, value: unknown): Pair {
  if (!Array.isArray(value) || value.length !== 2) throw bad(where, "expected a pair of ints");
  return [checkInt(where, value[0]), checkInt(where, value[1])];
}

function checkKind(where: string, kind: Kind, value: unknown, limits: Limits): unknown {
  switch (kind) {
    case "str": return checkStr(where, value, limits);
    case "int": return checkInt(where, value);
    case "float": return checkFloat(where, value);
    case "bool":
      if (typeof value !== "boolean") throw bad(where, `expected bool, got ${typeof value}`);
      return value;
    case "bytes":
      if (!(value instanceof Uint8Array)) throw bad(where, `expected bytes, got ${typeof value}`);
      if (value.byteLength > limits.maxFrameBytes) {
        throw new ProtocolError(ErrorCode.TOO_LARGE, `${where}: ${value.byteLength} bytes exceed ${limits.maxFrameBytes}`);
      }
      return value;
    case "list_str":
      if (!Array.isArray(value)) throw bad(where, "expected a list");
      checkItems(where, value.length, limits);
      return value.map((v) => checkStr(where, v, limits));
    case "list_int":
      if (!Array.isArray(value)) throw bad(where, "expected a list");
      checkItems(where, value.length, limits);
      return value.map((v) => checkInt(where, v));
    case "pair": return checkPair(where, value);
    case "list_pair":
      if (!Array.isArray(value)) throw bad(where, "expected a list");
      checkItems(where, value.length, limits);
      return value.map((v) => checkPair(where, v));
    case "dict_str":
      return Object.fromEntries(checkMap(where, value, limits).map(([k, v]) => [k, checkStr(`${where}[${k}]`, v, limits)]));
    case "dict_scalar":
      return Object.fromEntries(checkMap(where, value, limits).map(([k, v]) => [k, checkScalar(`${where}[${k}]`, v, limits)]));
    case "dict_ints":
      return Object.fromEntries(checkMap(where, value, limits).map(([k, v]) => {
        if (!Array.isArray(v)) throw bad(`${where}[${k}]`, "expected a list of ints");
        checkItems(where, v.length, limits);
        return [k, v.map((i) => checkInt(`${where}[${k}]`, i))];
      }));
    case "dict_bytes":
      return Object.fromEntries(checkMap(where, value, limits).map(([k, v]) => [k, checkKind(`${where}[${k}]`, "bytes", v, limits)]));
    case "ext": {
      const entries = checkMap(where, value, limits);
      if (entries.length > EXT_MAX_KEYS) throw bad(where, `at most ${EXT_MAX_KEYS} extension fields`);
      for (const [k] of entries) {
        if (k.length > EXT_MAX_KEY_CHARS || !EXT_KEY.test(k)) throw bad(where, `extension key ${JSON.stringify(k)} is not namespace.name`);
      }
      return Object.fromEntries(entries.map(([k, v]) => [k, checkExtValue(`${where}[${k}]`, v, limits, 1)]));
    }
  }
}

/** Bounds of `Hello.ext` (docs/protocol.md, "Extension fields"). */
const EXT_MAX_KEYS = 32;
const EXT_MAX_KEY_CHARS = 64;
const EXT_MAX_DEPTH = 4;
const EXT_KEY = /^[a-z0-9_-]+\.[a-z0-9_.-]+$/;

/** An extension value: str, int, finite float, bool, bytes, lists and str-keyed maps, at most 4 deep. */
function checkExtValue(where: string, value: unknown, limits: Limits, depth: number): unknown {
  if (depth > EXT_MAX_DEPTH) throw bad(where, `nested deeper than ${EXT_MAX_DEPTH}`);
  if (typeof value === "string" || typeof value === "boolean" || typeof value === "number" || typeof value === "bigint") {
    return checkScalar(where, value, limits);
  }
  if (value instanceof Uint8Array) return checkKind(where, "bytes", value, limits);
  if (Array.isArray(value)) {
    checkItems(where, value.length, limits);
    return value.map((v) => checkExtValue(where, v, limits, depth + 1));
  }
  return Object.fromEntries(checkMap(where, value, limits).map(([k, v]) => [k, checkExtValue(`${where}[${k}]`, v, limits, depth + 1)]));
}

function checkScalar(where: string, value: unknown, limits: Limits): Scalar {
  if (typeof value === "string") return checkStr(where, value, limits);
  if (typeof value === "boolean") return value;
  if (typeof value === "number" || typeof value === "bigint") return checkFloat(where, value);
  throw bad(where, `expected str, int, float or bool, got ${value === null ? "nil" : typeof value}`);
}

function increasing(values: number[]): boolean {
  return values.every((v, i) => i === 0 || v > values[i - 1]!);
}

/** The value constraints types alone cannot express (docs/protocol.md, "Messages"). */
function checkValues(msg: Message): void {
  const t = msg.t;
  switch (msg.t) {
    case "hello":
      require(msg.device_id !== "", "hello.device_id is empty");
      require(msg.budget_bytes >= 0 && msg.cores >= 0 && msg.num_samples >= 0, `${t}: a count is negative`);
      require(msg.resume_round >= -1, "hello.resume_round is below -1");
      for (const values of Object.values(msg.rows)) require(increasing(values) && (values[0] ?? 0) >= 0, "hello.rows is not strictly increasing");
      require((msg.input_shape ?? []).length <= 8 && (msg.input_shape ?? []).every((d) => d >= 1),
        "hello.input_shape has more than 8 axes or an axis below 1");
      require((msg.num_classes ?? -1) >= -1, "hello.num_classes is below -1");
      require((msg.probe_step_s ?? 0) >= 0 && (msg.probe_step_s ?? 0) <= PROBE_STEP_MAX_S,
        `hello.probe_step_s is outside [0, ${PROBE_STEP_MAX_S}] seconds`);
      break;
    case "welcome":
      require(msg.num_blocks >= 0 && msg.split >= 0 && msg.split <= msg.num_blocks, "welcome.split is outside [0, num_blocks]");
      for (const [a, b] of msg.chunks) require(0 <= a && a < b && b <= msg.num_blocks, `welcome.chunks has a bad range (${a}, ${b})`);
      require(msg.model_version >= 0 && msg.local_steps >= 0, "welcome: a count is negative");
      require(msg.batch_size >= 1, "welcome.batch_size is below 1");
      break;
    case "instruction":
      require(msg.round >= 0 && msg.model_version >= 0 && msg.split >= 0 && msg.local_steps >= 0, "instruction: a count is negative");
      require(msg.phase !== "" && msg.model_id !== "", "instruction.phase or model_id is empty");
      require(msg.chunk_ids.every((c) => c !== ""), "instruction.chunk_ids holds an empty id");
      require((SELECTIONS as readonly string[]).includes(msg.selection), `instruction.selection ${msg.selection} is not one of ${SELECTIONS.join(", ")}`);
      require(msg.lr >= 0 && msg.deadline_s >= 0, "instruction.lr or deadline_s is negative");
      require(Object.values(msg.digests ?? {}).every((d) => SHA256_HEX.test(d)), "instruction.digests holds a value that is not 64 lowercase hex digits");
      break;
    case "fetch":
      require(msg.round >= 0 && msg.offset >= 0 && msg.payload_id !== "", "fetch: bad round, offset or payload_id");
      require(!msg.held || SHA256_HEX.test(msg.held), "fetch.held is neither empty nor 64 lowercase hex digits");
      break;
    case "transfer_begin":
      require(msg.transfer_id !== "" && msg.kind !== "", "transfer_begin: empty transfer_id or kind");
      require(msg.sha256 === "" || SHA256_HEX.test(msg.sha256), "transfer_begin.sha256 is neither empty nor 64 lowercase hex digits");
      require(msg.frame_size >= 1, "transfer_begin.frame_size is below 1");
      require(msg.total_size >= 0 && 0 <= msg.offset && msg.offset <= msg.total_size, "transfer_begin.offset is outside [0, total_size]");
      break;
    case "transfer_frame":
      require(msg.transfer_id !== "" && msg.offset >= 0 && msg.data.byteLength > 0, "transfer_frame: empty id or data, or a negative offset");
      break;
    case "transfer_end":
      require(msg.transfer_id !== "" && SHA256_HEX.test(msg.sha256), "transfer_end: empty id or a bad sha256");
      break;
    case "report": {
      const [a, b] = msg.trained;
      require(msg.round >= 0 && msg.num_samples >= 0 && msg.phase !== "", "report: bad round, num_samples or phase");
      require(msg.model_version === undefined || msg.model_version >= -1, "report.model_version is below -1");
      require(0 <= a && a <= b, `report.trained has a bad range (${a}, ${b})`);
      require(msg.transfer_id !== "" || (a === 0 && b === 0), "report.trained must be (0, 0) when the report has no tensors");
      break;
    }
    case "ack": require(msg.round >= 0, "ack.round is negative"); break;
    case "error": require(msg.code !== "", "error.code is empty"); break;
    case "resume": require(msg.transfer_id !== "" && msg.offset >= 0, "resume: empty id or negative offset"); break;
    case "bye": break;
    default: checkSecAgg(msg);
  }
}

const encoder = new Encoder();

/** Encode a message as one msgpack map; refuses (`ProtocolError`) what the peer would refuse. */
export function encode(msg: Message): Uint8Array {
  const schema = SCHEMAS[msg.t];
  if (schema === undefined) throw new ProtocolError(ErrorCode.MALFORMED, `cannot encode ${String(msg.t)}`);
  const body: Record<string, unknown> = { t: msg.t, v: PROTOCOL_VERSION };
  const unbounded = makeLimits({ maxFrameBytes: 2 ** 52, maxItems: 2 ** 52, maxStrLen: 2 ** 52 });
  for (const [name, kind] of schema) {
    body[name] = checkKind(`${msg.t}.${name}`, kind, (msg as unknown as Record<string, unknown>)[name], unbounded);
  }
  for (const [name, kind, fallback] of OPTIONAL[msg.t] ?? []) {
    const value = (msg as unknown as Record<string, unknown>)[name];
    if (!isDefault(value, fallback)) body[name] = checkKind(`${msg.t}.${name}`, kind, value, unbounded);
  }
  checkValues(msg);
  return encoder.encode(body);
}

/** Decode and validate one message (docs/protocol.md, "Field types"). */
export function decode(data: Uint8Array, limits: Limits = DEFAULT_LIMITS): Message {
  if (data.byteLength > limits.maxMessageBytes) {
    throw new ProtocolError(ErrorCode.TOO_LARGE, `message of ${data.byteLength} bytes exceeds ${limits.maxMessageBytes}`);
  }
  let obj: unknown;
  try {
    obj = new Decoder({
      maxStrLength: limits.maxStrLen * 4, maxBinLength: limits.maxFrameBytes, maxArrayLength: Math.max(limits.maxItems, 2),
      maxMapLength: Math.max(limits.maxItems, 32), maxExtLength: limits.maxStrLen,
    }).decode(data);
  } catch (exc) {
    const text = String(exc).slice(0, 200);
    throw new ProtocolError(/exceeds|max/i.test(text) ? ErrorCode.TOO_LARGE : ErrorCode.MALFORMED, `not valid msgpack: ${text}`);
  }
  if (!isPlainObject(obj)) throw new ProtocolError(ErrorCode.MALFORMED, "a message must be a msgpack map");
  if (obj["v"] !== PROTOCOL_VERSION) {
    throw new ProtocolError(ErrorCode.BAD_VERSION, `protocol version ${String(obj["v"])} is not ${PROTOCOL_VERSION}`);
  }
  const t = obj["t"];
  const schema = typeof t === "string" && Object.hasOwn(SCHEMAS, t) ? SCHEMAS[t as Message["t"]] : undefined;
  if (schema === undefined) throw new ProtocolError(ErrorCode.UNKNOWN_TYPE, `unknown message type ${String(t).slice(0, 64)}`);
  const optional = OPTIONAL[t as Message["t"]] ?? [];
  const expected = new Set(["t", "v", ...schema.map(([n]) => n)]);
  const keys = Object.keys(obj).filter((k) => !optional.some(([n]) => n === k));
  if (keys.length !== expected.size || keys.some((k) => !expected.has(k))) {
    const missing = [...expected].filter((k) => !(k in obj));
    const extra = keys.filter((k) => !expected.has(k)).map((k) => k.slice(0, 40));
    throw new ProtocolError(ErrorCode.MALFORMED, `${t}: missing fields [${missing.join(", ")}], unexpected fields [${extra.join(", ")}]`);
  }
  const msg: Record<string, unknown> = { t };
  for (const [name, kind] of schema) msg[name] = checkKind(`${t}.${name}`, kind, obj[name], limits);
  for (const [name, kind, fallback] of optional) msg[name] = name in obj ? checkKind(`${t}.${name}`, kind, obj[name], limits) : fallback;
  checkValues(msg as unknown as Message);
  return msg as unknown as Message;
}
