"""Run a command under a hard memory cap equal to a device's budget, and print what it held, as JSON.

The cap is emulator.capping's (a cgroup memory controller: the kernel kills the
process past the budget); the peak is both the cgroup's (memory it was charged) and the process's
resident high-water mark, sampled (the figure a device's budget is planned in, edge_sdk.memory).
Exits 77 with one line when this machine has no cgroup memory controller this process may use.

    PYTHONPATH=. python edge_sdk_js/test/capped.py BUDGET_BYTES -- node dist/cli.js ...
"""

from __future__ import annotations

import json
import sys
import time

from edge_sdk.memory import peak_rss_bytes
from emulator.capping import CappedProcess, mechanism_status

SKIP = 77


def main() -> None:
    budget, argv = int(sys.argv[1]), sys.argv[sys.argv.index("--") + 1:]
    status = mechanism_status()
    mechanism = next((m for m in ("cgroup-v2", "cgroup-v1") if status[m] == "ok"), None)
    if mechanism is None:
        print(f"no cgroup memory controller: {status['cgroup-v1']}; {status['cgroup-v2']}")
        sys.exit(SKIP)
    proc = CappedProcess.start(argv, budget, mechanism=mechanism, timeout_s=900)
    rss = 0
    while proc.poll() is None:
        try:
            rss = max(rss, peak_rss_bytes(proc.pid))
        except Exception:  # the process is gone between the poll and the read
            pass
        time.sleep(0.05)
    r = proc.wait()
    print(json.dumps({"returncode": r.returncode, "mechanism": r.mechanism, "budget_bytes": r.budget_bytes,
                      "cgroup_peak_bytes": r.peak_bytes, "rss_peak_bytes": rss, "oom_killed": r.oom_killed,
                      "timed_out": r.timed_out}))


if __name__ == "__main__":
    main()
