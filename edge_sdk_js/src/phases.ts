/**
 * What a device does for an instruction, looked up by name: phases, report hooks and selection
 * kinds (docs/protocol.md, "Phases" and "Selections"; the Python twin is edge_sdk/phases.py).
 *
 * A server's instruction names a `phase` (what to do: `train`, `evaluate`, `compare`, or any phase
 * an algorithm adds) and a `selection` (how the state it sends is cut: `tail`, `rows`, `channels`).
 * The device knows neither by name: it looks both up in its `DeviceRegistry` and runs what it
 * finds, so an algorithm's device step is one module that adds its entries (src/algorithms/):
 *
 * - a phase handler (`PhaseHandler`) is an async function of a `PhaseContext` that returns a
 *   `PhaseResult` (the report's metrics, and tensors if the phase sends some);
 * - a report hook (`ReportHook`) runs after a phase's handler and may add metrics to its report
 *   (FedALIGN's incentive check after `evaluate`, src/algorithms/fedalign.ts);
 * - a selection kind (`SelectionKind`) says whether a training graph can train state cut that way,
 *   and checks an instruction before anything is downloaded (src/algorithms/width.ts).
 *
 * Registries are immutable values: `extended()` returns a new one, and a device is given its
 * registry (`DeviceOptions.registry`; default `DEFAULT_REGISTRY`, src/algorithms/index.ts), so two
 * devices of one page may run different algorithms.
 *
 * ```ts
 * const labelCount: PhaseHandler = async (ctx) => ({ metrics: { classes: new Set(ctx.y.data).size } });
 * const registry = DEFAULT_REGISTRY.extended({ phases: { label_count: labelCount } });
 * new DeviceClient({ ...options, registry });
 * ```
 */
import { ErrorCode, ProtocolError } from "./errors.js";
import type { Instruction, Pair, Scalar } from "./messages.js";
import { isRowSparse, type Tensor, type TensorValue } from "./tensors.js";

export type Metrics = Record<string, Scalar>;

/** A device's trained update of this round for one model payload (trained once per round). */
export interface TrainedUpdate {
  readonly deltas: Record<string, Tensor>;
  readonly numSamples: number;
  /** The block range [split, L) the deltas cover. */
  readonly trained: Pair;
  /** loss_before, loss_after, steps, backend. */
  readonly metrics: Metrics;
}

/**
 * What a phase reports: `metrics`, and `tensors` for a phase that sends some (an `update` transfer
 * follows the report). `numSamples` left out means all the device's local samples; `trained` is
 * the block range the tensors cover ([0, 0] without tensors).
 */
export interface PhaseResult {
  metrics: Metrics;
  tensors?: Record<string, TensorValue>;
  numSamples?: number;
  trained?: Pair;
}

/**
 * What a phase handler or report hook may use (the device implements it, src/roundwork.ts). The
 * device's own steps are done at most once per round however many phases ask for them: the frozen
 * chunks run forward once, the update is trained once.
 */
export interface PhaseContext {
  readonly instruction: Instruction;
  readonly deviceId: string;
  /** The local inputs (a leading sample axis) and labels. */
  readonly x: Tensor;
  readonly y: Tensor;
  /** Values this round's phases share (a new round starts empty). */
  readonly notes: Metrics;
  /** This round's update for the instruction's model payload (trained on first use). */
  trained(): Promise<TrainedUpdate>;
  /** Loss (and accuracy) of the received model on the local data, without training. */
  evaluate(): Promise<Metrics>;
  /** Download and decode one of the instruction's payloads (a broadcast, ...). */
  fetchTensors(payloadId: string): Promise<Record<string, TensorValue>>;
  /** This round's timings, peak memory and activation storage, as report metrics. */
  usage(): Metrics;
  /** Tell the device's event listener (`onEvent`, `--json-events`) something happened. */
  event(kind: string, data: Record<string, unknown>): void;
}

export type PhaseHandler = (ctx: PhaseContext) => Promise<PhaseResult>;
export type ReportHook = (ctx: PhaseContext, metrics: Metrics) => void;

/**
 * How a device trains state cut one way. `trainsGraph`: a training graph can train it (a
 * training-graph backend refuses the instruction otherwise); `check(instruction)` refuses a bad
 * instruction with a `ProtocolError` before any download.
 */
export interface SelectionKind {
  readonly trainsGraph: boolean;
  readonly check?: (ins: Instruction) => void;
}

export interface RegistryEntries {
  phases?: Record<string, PhaseHandler>;
  selections?: Record<string, SelectionKind>;
  /** Report hooks run after the named phase (after the hooks it has). */
  after?: Record<string, ReportHook>;
}

function frozenMap<V>(entries: Iterable<[string, V]>): ReadonlyMap<string, V> {
  const map = new Map(entries);
  const refuse = () => { throw new TypeError("a registry is immutable: build a new one with extended()"); };
  return Object.freeze(Object.assign(map, { set: refuse, delete: refuse, clear: refuse }));
}

/** Phases, report hooks and selection kinds a device knows, by name. Immutable: build a new one with `extended()`. */
export class DeviceRegistry {
  readonly phases: ReadonlyMap<string, PhaseHandler>;
  readonly selections: ReadonlyMap<string, SelectionKind>;
  readonly hooks: ReadonlyMap<string, readonly ReportHook[]>;

  constructor(entries: { phases?: Iterable<[string, PhaseHandler]>; selections?: Iterable<[string, SelectionKind]>;
    hooks?: Iterable<[string, readonly ReportHook[]]> } = {}) {
    this.phases = frozenMap(entries.phases ?? []);
    this.selections = frozenMap(entries.selections ?? []);
    this.hooks = frozenMap([...(entries.hooks ?? [])].map(([k, v]) => [k, Object.freeze([...v])]));
    Object.freeze(this);
  }

  /**
   * A registry with these entries added: new `phases` and `selections` (a name already registered
   * is an error: extend an existing phase with a hook instead), and report hooks run `after` the
   * named phase (after the hooks it has).
   */
  extended(add: RegistryEntries): DeviceRegistry {
    const phases = Object.entries(add.phases ?? {});
    const selections = Object.entries(add.selections ?? {});
    for (const [kind, fresh, old] of [["phase", phases, this.phases], ["selection", selections, this.selections]] as const) {
      const taken = fresh.map(([name]) => name).filter((name) => old.has(name)).sort();
      if (taken.length > 0) throw new Error(`${kind} ${taken.map((n) => `'${n}'`).join(", ")} is already registered`);
      if (fresh.some(([name]) => name === "")) throw new Error(`a ${kind} name is a non-empty string`);
    }
    const hooks = new Map(this.hooks);
    for (const [phase, hook] of Object.entries(add.after ?? {})) hooks.set(phase, [...(hooks.get(phase) ?? []), hook]);
    return new DeviceRegistry({ phases: [...this.phases, ...phases], selections: [...this.selections, ...selections], hooks });
  }

  phase(name: string): PhaseHandler {
    const handler = this.phases.get(name);
    if (handler === undefined) {
      throw new ProtocolError(ErrorCode.UNEXPECTED, `this device does not know the phase '${name}' (it knows ${known(this.phases)})`);
    }
    return handler;
  }

  selection(name: string): SelectionKind {
    const kind = this.selections.get(name);
    if (kind === undefined) {
      throw new ProtocolError(ErrorCode.UNEXPECTED, `this device does not know the selection '${name}' (it knows ${known(this.selections)})`);
    }
    return kind;
  }

  /** The instruction's phase, then the hooks registered after it. */
  async run(ctx: PhaseContext): Promise<PhaseResult> {
    const result = await this.phase(ctx.instruction.phase)(ctx);
    for (const hook of this.hooks.get(ctx.instruction.phase) ?? []) hook(ctx, result.metrics);
    return result;
  }
}

function known(map: ReadonlyMap<string, unknown>): string {
  return [...map.keys()].sort().join(", ");
}

// -- the built-in phases (docs/protocol.md, "Phases") ---------------------------------------------
/** Train the received model (once per round) and report its deltas. */
export const trainPhase: PhaseHandler = async (ctx) => {
  const update = await ctx.trained();
  return { metrics: { ...update.metrics, ...ctx.usage() }, tensors: update.deltas, numSamples: update.numSamples,
    trained: update.trained };
};

/** Report the received model's loss on the local data. */
export const evaluatePhase: PhaseHandler = async (ctx) => ({ metrics: await ctx.evaluate() });

/** Report the distance between this round's update and the instruction's broadcast. */
export const comparePhase: PhaseHandler = async (ctx) => {
  if (!ctx.instruction.broadcast_id) throw new ProtocolError(ErrorCode.MALFORMED, "a compare instruction needs a broadcast");
  const update = await ctx.trained();
  const broadcast = await ctx.fetchTensors(ctx.instruction.broadcast_id);
  return { metrics: { ...updateDistance(update.deltas, broadcast), ...update.metrics } };
};

/**
 * ||delta - b||^2, <delta, b> and ||delta||^2 over the broadcast's entries (VaRSeL eq. 8 needs the
 * first), in float64; entries the update lacks are skipped. This device's update is dense, so a
 * row-sparse broadcast entry is refused.
 */
export function updateDistance(deltas: Record<string, Tensor>, broadcast: Record<string, TensorValue>): Metrics {
  let sqDistance = 0, dot = 0, sqNorm = 0;
  for (const [name, b] of Object.entries(broadcast)) {
    const d = deltas[name];
    if (d === undefined) continue;
    if (isRowSparse(b)) throw new ProtocolError(ErrorCode.MALFORMED, `broadcast ${name} is row-sparse; this device's update is dense`);
    if (b.shape.join(",") !== d.shape.join(",")) throw new ProtocolError(ErrorCode.MALFORMED, `broadcast ${name} has shape [${b.shape}], the update [${d.shape}]`);
    for (let i = 0; i < d.data.length; i++) {
      const dv = Number(d.data[i]), bv = Number(b.data[i]);
      sqDistance += (dv - bv) ** 2; dot += dv * bv; sqNorm += dv * dv;
    }
  }
  return { sq_distance: sqDistance, dot, sq_norm: sqNorm };
}

/**
 * The phases and selections every device knows without any algorithm's module: train, evaluate,
 * compare; the whole tail and row-cut tables (a training graph refuses a row-sparse state itself).
 */
export const BUILTIN_REGISTRY = new DeviceRegistry({
  phases: [["train", trainPhase], ["evaluate", evaluatePhase], ["compare", comparePhase]],
  // `adapters`: the tail sent whole, trained through its LoRA adapters by the server's graph for it
  // (its frozen weights are the graph's `frozen` inputs; the update holds what the graph trains).
  selections: [["tail", { trainsGraph: true }], ["rows", { trainsGraph: true }], ["adapters", { trainsGraph: true }]],
});
