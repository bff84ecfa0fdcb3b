/**
 * Device-side parts of the federated algorithms that need more than the built-in phases. Each
 * module adds its phases, report hooks and selection kinds to a `DeviceRegistry` (its
 * `DEVICE_STEPS`); the server-side part is the strategy of the same name in
 * orchestrator/strategies. `DEFAULT_REGISTRY` is what a device knows unless its options say
 * otherwise (`DeviceOptions.registry`): the built-in phases plus every module here.
 */
import { BUILTIN_REGISTRY, type DeviceRegistry } from "../phases.js";
import * as fedalign from "./fedalign.js";
import * as width from "./width.js";

export { fedalign, width };
export { incentiveCheck } from "./fedalign.js";

/**
 * The built-in phases (train, evaluate, compare; tail and rows), FedALIGN's incentive check after
 * evaluate and train, and width reduction's channel selection.
 */
export const DEFAULT_REGISTRY: DeviceRegistry = BUILTIN_REGISTRY.extended(fedalign.DEVICE_STEPS).extended(width.DEVICE_STEPS);
