/**
 * Width reduction on the device: the `channels` selection (static HeteroFL, FjORD's ordered
 * dropout; EmbracingFL Section 4.1 and appendix 6.4; the server side is
 * orchestrator/strategies/width.py, the Python device's edge_sdk/algorithms/width.py).
 *
 * The server sends a leading slice of every entry and the width ratio r in `config["width"]`; a
 * device builds its model at width r and trains the slice. Training graphs are exported for
 * full-width models only, so a training-graph backend (every backend of this SDK so far) refuses
 * the instruction before any download; the server never sends one to a device that declares no
 * torch (docs/protocol.md, "Runtimes").
 */
import { ErrorCode, ProtocolError } from "../errors.js";
import type { Instruction } from "../messages.js";
import type { RegistryEntries, SelectionKind } from "../phases.js";

/** Instruction config key of a channel selection's width ratio. */
export const WIDTH_KEY = "width";

/** The width ratio a `channels` instruction asks for: its `config["width"]`, in (0, 1]. */
export function instructionWidth(ins: Instruction): number {
  const value = ins.config[WIDTH_KEY];
  if (typeof value !== "number" || !(value > 0 && value <= 1)) {
    throw new ProtocolError(ErrorCode.MALFORMED, `a channels instruction needs config['${WIDTH_KEY}'] in (0, 1], got ${String(value)}`);
  }
  return value;
}

/** A channel slice: the model at the instruction's width; no training graph trains it. */
export const CHANNELS: SelectionKind = Object.freeze({ trainsGraph: false, check: (ins: Instruction) => { instructionWidth(ins); } });

/** This algorithm's entries for `DeviceRegistry.extended`. */
export const DEVICE_STEPS: RegistryEntries = { selections: { channels: CHANNELS } };
