"""Print what an orchestrator's journal says about a run, as JSON: each device's runtimes, role
and split, the rounds and how many finished, and every report (with the runtime it says trained it)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path


def main() -> None:
    db = sqlite3.connect(Path(sys.argv[1]) / "journal.sqlite3")
    devices = {}
    for device_id, profile, plan in db.execute("SELECT device_id, profile, plan FROM devices"):
        profile, plan = json.loads(profile), json.loads(plan)
        devices[device_id] = {"runtimes": profile.get("runtimes"), "role": plan.get("role"), "split": plan.get("split"),
                              "backend": plan.get("backend")}
    rounds = [{"round": r, "finished": f is not None, "metrics": json.loads(m) if m else {}}
              for r, f, m in db.execute("SELECT round, finished, metrics FROM rounds ORDER BY round")]
    reports = [{"round": r, "device": d, "phase": ph, "accepted": a,
                "backend": (json.loads(info).get("metrics") or {}).get("backend")}
               for r, d, ph, a, info in db.execute("SELECT round, device_id, phase, accepted, info FROM reports")]
    print(json.dumps({"devices": devices, "rounds": rounds, "reports": reports}))


if __name__ == "__main__":
    main()
