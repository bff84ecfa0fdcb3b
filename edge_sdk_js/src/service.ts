/**
 * A device that keeps running: one run after another, as a service on a board does (the Python
 * twin is edge_sdk/service.py). A run ends when the server says goodbye (training over, or a server
 * stopping for an upgrade); the service then looks for the next run with a fresh client (so the
 * data is read again) that connects with the client's own backoff while no server answers. A
 * server that ends runs at once (one already finished) is asked again less and less often, up to
 * `maxDelayS`. A refusal or any error other than a lost connection ends the service.
 */
import { backoffDelay, sleep } from "./backoff.js";
import type { DeviceClient, RoundReport } from "./client.js";
import type { EventSink } from "./roundwork.js";
import { settingDefault } from "./settings.js";

export interface ServiceOptions {
  /** Return after the first run instead of waiting for the next one. */
  once?: boolean;
  /** The longest wait before looking for the next run, in seconds (default: the key table's `reconnect-max-delay`). */
  maxDelayS?: number;
  onEvent?: EventSink;
}

/** Run clients from `makeClient` one run after another (one with `once`); returns the last run's reports. */
export async function runService(makeClient: () => DeviceClient, options: ServiceOptions = {}): Promise<RoundReport[]> {
  let idleRuns = 0;
  for (;;) {
    const reports = await makeClient().run();
    if (options.once) return reports;
    idleRuns = reports.length > 0 ? 0 : idleRuns + 1;
    const delay = backoffDelay(idleRuns + 2, options.maxDelayS ?? settingDefault("reconnect-max-delay") as number); // a restarting server needs a moment
    options.onEvent?.("run_over", { rounds: new Set(reports.map((r) => r.round)).size, next_check_s: Math.round(delay * 100) / 100 });
    await sleep(delay);
  }
}
