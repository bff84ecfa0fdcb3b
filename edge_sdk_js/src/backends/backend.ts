/**
 * What trains a device's tail: a training backend (the Python twin is edge_sdk/backends/). The
 * device (src/roundwork.ts) runs the frozen chunks forward itself, then asks its backend for the
 * tail of an instruction (`prepare`: the backend downloads what it trains from, the model payload
 * and, for a training-graph backend, the graph), trains or evaluates it on the activations, and
 * releases it. A backend declares the runtimes the device's hello names (docs/protocol.md,
 * "Runtimes"): the server plans the device, and picks the payloads it is sent, by them.
 */
import type { Instruction, Welcome } from "../messages.js";
import type { Tensor, TensorValue } from "../tensors.js";
import type { TrainConfig, TrainResult } from "../trainer.js";

/** What a backend may use to prepare the tail of one instruction. */
export interface TailRequest {
  readonly instruction: Instruction;
  /** The server's plan of this device (model name, block count, batch size, ...). */
  readonly welcome: Welcome;
  /** Download one of the instruction's payloads (sha256 checked as it lands; resumed after a drop). */
  fetch(payloadId: string): Promise<Uint8Array>;
  /** Download and decode a tensor payload (the model payload `instruction.model_id`, ...), checked against the device's limits. */
  fetchTensors(payloadId: string): Promise<Record<string, TensorValue>>;
}

/** A tail ready to train or evaluate: the received state, loaded into whatever the backend runs. */
export interface PreparedTail {
  /** tau local steps on `x` (the tail's input for every local sample) and `y`; deltas per entry. */
  train(x: Tensor, y: Tensor, cfg: TrainConfig): Promise<TrainResult>;
  /** Loss (and accuracy, for classification) of the received state on the local samples. */
  evaluate(x: Tensor, y: Tensor, cfg: TrainConfig): Promise<Record<string, number>>;
  /** Free what the tail holds (sessions, buffers); called once, after the last use. */
  release(): Promise<void>;
}

export interface TrainingBackend {
  /** What the device's reports name in `metrics.backend`. */
  readonly name: string;
  /** The runtimes the device's hello declares, most preferred first. */
  readonly runtimes: readonly string[];
  /** Trains from the server's training graphs (`config["train_graph_id"]`): a selection no graph trains is refused. */
  readonly needsGraph: boolean;
  /** Refuse (`ProtocolError`) an instruction this backend cannot carry out, before anything is downloaded. */
  check(ins: Instruction): void;
  /** The instruction's tail with its received state. */
  prepare(request: TailRequest): Promise<PreparedTail>;
  /** One local step of the hello's probe (src/backends/probe.ts), where a backend's steps cost more
   * than plain JavaScript's; without it the probe runs `probeSgdStep`. */
  probeStep?(): Promise<void>;
}
