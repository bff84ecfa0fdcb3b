/** The wait before a reconnect or the next look for a run, as the Python device's `edge_sdk.client.backoff_delay`. */

/**
 * Seconds to wait before retry `attempt` (0-based): doubling from `firstS`, capped at `maxDelayS`,
 * with jitter (a random 50-100%) so that a fleet that lost its server at once does not come back at once.
 */
export function backoffDelay(attempt: number, maxDelayS: number, firstS = 0.2): number {
  return Math.min(maxDelayS, firstS * 2 ** Math.min(attempt, 32)) * (0.5 + Math.random() / 2);
}

/** Resolves after `seconds`. */
export function sleep(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}
