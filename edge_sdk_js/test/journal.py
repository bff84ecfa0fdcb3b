"""Print what an orchestrator's journal says about a run, as JSON: each device's runtimes, role
and split, the rounds and how many finished, and every report (with the runtime it says trained it). Read through the store's own
read-only view (orchestrator/store/ owns the journal's schema), so the run may still be going."""

from __future__ import annotations

import json
import sys

from orchestrator.store import Store


def main() -> None:
    with Store.open_readonly(sys.argv[1]) as store:
        devices = {d["device_id"]: {"runtimes": d["profile"].get("runtimes"), "role": d["plan"].get("role"),
                                    "split": d["plan"].get("split"), "backend": d["plan"].get("backend"),
                                    "adapters": bool(d["plan"].get("adapters"))}
                   for d in store.devices.all()}
        rounds = [{"round": r["round"], "finished": r["complete"], "metrics": r["metrics"] or {}} for r in store.rounds.all()]
        reports = [{"round": u["round"], "device": u["device_id"], "phase": u["phase"],
                    "accepted": None if u.get("accepted") is None else int(bool(u["accepted"])),
                    "backend": (u.get("metrics") or {}).get("backend"), "selection": u.get("selection"),
                    "peak_rss_bytes": (u.get("metrics") or {}).get("peak_rss_bytes"),
                    "model_version": u.get("model_version"), "staleness": u.get("staleness")}
                   for u in store.reports.all()]
    print(json.dumps({"devices": devices, "rounds": rounds, "reports": reports}))


if __name__ == "__main__":
    main()
