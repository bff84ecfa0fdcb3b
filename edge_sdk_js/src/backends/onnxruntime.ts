/**
 * The training-graph backend on the `onnxruntime-common` API (docs/protocol.md, "Training
 * graphs"): the tail's training graph runs in an inference session of the injected runtime
 * (onnxruntime-node or onnxruntime-web, src/runtime.ts) and the update is the momentum SGD of
 * src/trainer.ts, step for step the Python device's (edge_sdk/ort_trainer.py).
 */
import { ErrorCode, ProtocolError } from "../errors.js";
import { TRAIN_GRAPH_KEY, type Instruction } from "../messages.js";
import type { Runtime } from "../runtime.js";
import type { Tensor, TensorValue } from "../tensors.js";
import { OrtTail, evaluateTail, parseTrainGraph, trainTail, type TrainConfig, type TrainGraph } from "../trainer.js";
import type { PreparedTail, TailRequest, TrainingBackend } from "./backend.js";

/** The instruction's training graph payload id (a backend on graphs needs one). */
function graphId(ins: Instruction): string {
  const id = ins.config[TRAIN_GRAPH_KEY];
  if (typeof id !== "string" || !id) {
    throw new ProtocolError(ErrorCode.UNEXPECTED, "this device trains from training graphs only, and the instruction names none");
  }
  return id;
}

/** Refuse an instruction that names no training graph (every backend on graphs does). */
export function checkGraphInstruction(ins: Instruction): void {
  graphId(ins);
}

class GraphTail implements PreparedTail {
  constructor(private readonly tail: OrtTail, private readonly state: Record<string, TensorValue>) {}
  train(x: Tensor, y: Tensor, cfg: TrainConfig) { return trainTail(this.tail, this.state, x, y, cfg); }
  evaluate(x: Tensor, y: Tensor, cfg: TrainConfig) { return evaluateTail(this.tail, this.state, x, y, cfg); }
  release() { return this.tail.release(); }
}

/** Training graphs in ONNX Runtime sessions of `runtime`; the hello declares the runtime's name. */
export class GraphBackend implements TrainingBackend {
  readonly name: string;
  readonly runtimes: readonly string[];
  readonly needsGraph = true;

  constructor(readonly runtime: Runtime, readonly threads = 1) {
    this.name = runtime.name;
    this.runtimes = Object.freeze([runtime.name]);
  }

  check(ins: Instruction): void {
    checkGraphInstruction(ins);
  }

  async prepare(req: TailRequest): Promise<PreparedTail> {
    const { graph, state } = await receiveTail(req);
    return new GraphTail(new OrtTail(this.runtime, graph, this.threads), state);
  }
}

/** The instruction's training graph (checked against the plan) and then the state it is fed. */
export async function receiveTail(req: TailRequest): Promise<{ graph: TrainGraph; state: Record<string, TensorValue> }> {
  const ins = req.instruction;
  const graph = parseTrainGraph(await req.fetch(graphId(ins)));
  if (graph.model !== req.welcome.model || graph.split !== ins.split) {
    throw new ProtocolError(ErrorCode.MALFORMED, `training graph of ${graph.model} split ${graph.split}, instruction for ${req.welcome.model} split ${ins.split}`);
  }
  return { graph, state: await req.fetchTensors(ins.model_id) };
}
