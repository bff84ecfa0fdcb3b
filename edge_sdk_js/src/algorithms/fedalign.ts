/**
 * FedALIGN on the device: its own incentive check (Lamsal et al., "FedALIGN: Federated Adaptive
 * Learning with Inclusion of Global Needs", Section 3.1; the server side is
 * orchestrator/strategies/fedalign.py, the Python device's edge_sdk/algorithms/fedalign.py).
 *
 * A non-priority device k takes part in a round only if |F_k(w) - F(w)| <= epsilon for the model w
 * it received, with F(w) the global (priority) loss. The server sends `global_loss` = F(w) and
 * `epsilon` in an `evaluate` instruction's config; after the evaluation (F_k(w) = its `loss`) the
 * device reports its verdict `within_epsilon` (1 or 0), and repeats it on a `train` report of the
 * same round, so a device that gets a `train` anyway says it declined. The server decides, and
 * checks again.
 */
import type { Scalar } from "../messages.js";
import type { Metrics, RegistryEntries, ReportHook } from "../phases.js";

/** The report metric (and round note) holding the device's verdict, 1 or 0. */
export const VERDICT = "within_epsilon";

/**
 * The device's own check: is |F_k(w) - F(w)| <= epsilon for the received model w? `metrics` are
 * this device's `evaluate` results (F_k(w) = `loss`), `config` the instruction's (`global_loss` =
 * F(w), `epsilon`). null when the server asked for no check.
 */
export function incentiveCheck(metrics: Record<string, Scalar>, config: Record<string, Scalar>): boolean | null {
  if (!("global_loss" in config) || !("epsilon" in config)) return null;
  const loss = Number(metrics["loss"]), g = Number(config["global_loss"]), eps = Number(config["epsilon"]);
  return Number.isFinite(loss) && Number.isFinite(g) && Math.abs(loss - g) <= eps;
}

/** After `evaluate`: make the check when the server asked for it, report and remember the verdict. */
export const checkAfterEvaluate: ReportHook = (ctx, metrics: Metrics) => {
  const verdict = incentiveCheck(metrics, ctx.instruction.config);
  if (verdict === null) return;
  ctx.notes[VERDICT] = metrics[VERDICT] = verdict ? 1 : 0;
  ctx.event("incentive_check", { device: ctx.deviceId, round: ctx.instruction.round, [VERDICT]: verdict });
};

/**
 * After `train`: a train report of a round whose check was made carries its verdict (a train
 * report always carries tensors, so a device that declined says so here; the server refuses it).
 */
export const verdictAfterTrain: ReportHook = (ctx, metrics) => {
  if (VERDICT in ctx.notes) metrics[VERDICT] = ctx.notes[VERDICT]!;
};

/** This algorithm's entries for `DeviceRegistry.extended`. */
export const DEVICE_STEPS: RegistryEntries = { after: { evaluate: checkAfterEvaluate, train: verdictAfterTrain } };
