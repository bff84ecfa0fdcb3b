"""What the status page shows, read from the running server and its journal; it changes nothing.

Devices are the journal's (every device that ever said hello) joined with the connected sessions;
rounds and their metrics are the journal's, the round under way is the round loop's; each device's
last report and the refusals and errors come from the server's events (:class:`StatusFeed`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from edge_sdk.models import LayeredModel
from orchestrator.config import ServerConfig
from orchestrator.parts import Session
from orchestrator.rounds import RoundState
from orchestrator.server.admission import Admission
from orchestrator.server.planning import Planning
from orchestrator.server.wirebytes import device_bytes, round_bytes
from orchestrator.store import Store

__all__ = ["Notice", "ServerView", "StatusFeed", "snapshot"]

#: Server events the page lists as refusals and errors.
NOTICES = ("closed", "rejected", "late", "device_error", "round_failed", "over_budget", "train_graph_refused")
MAX_NOTICES = 100


@dataclass(frozen=True)
class ServerView:
    """The server as its web pages read it: typed, and nothing of it they could change but through the
    parts' own methods (admission spends a page's proofs in its replay record and issues its tickets).
    The server builds it (``Orchestrator``) and hands it to :class:`~orchestrator.views.web.site.WebSite`."""

    config: ServerConfig
    store: Store
    admission: Admission  # who may connect: its replay record spends the status page's proofs too
    sessions: Mapping[str, Session]
    model: LayeredModel  # its input shape and classes, for the device page
    planning: Planning  # the budget arithmetic: the page's least budget
    round: Callable[[], RoundState | None]  # the round under way, if any
    port: Callable[[], int | None]  # the port the server listens on, once it does


@dataclass(frozen=True)
class Notice:
    """A refusal or an error, as the status page lists it."""

    time: float
    kind: str
    device: str
    round: int | None
    message: str


class StatusFeed:
    """The server's events the journal does not keep: the last report of each device, refusals, errors."""

    def __init__(self) -> None:
        self.last_report: dict[str, dict[str, object]] = {}
        self.notices: deque[Notice] = deque(maxlen=MAX_NOTICES)

    def take(self, kind: str, data: Mapping[str, object]) -> None:
        device = str(data.get("device", ""))
        if kind == "update":
            self.last_report[device] = {"round": data.get("round"), "phase": data.get("phase"),
                                        "accepted": data.get("accepted"), "reason": data.get("reason"),
                                        "time": time.time()}
        if kind in NOTICES:
            message = data.get("message") or data.get("reason") or data.get("code") or ""
            if kind == "over_budget":
                message = f"split {data.get('split')} over its budget (planned {data.get('planned_split')})"
            rnd = data.get("round")
            self.notices.append(Notice(time.time(), kind, device, rnd if isinstance(rnd, int) else None,
                                       str(message)[:256]))


def snapshot(server: ServerView, feed: StatusFeed) -> dict[str, object]:
    """The status page's data, as JSON-ready values."""
    config = server.config
    rs = server.round()
    current = None if rs is None else {"round": rs.round, "selected": rs.num_selected, "reported": rs.num_reported(),
                                       "deadline_s": max(0.0, rs.deadline - time.monotonic())}
    journaled = server.store.rounds.all()
    rounds = [{"round": r["round"], "complete": r["complete"], "selected": len(r["selected"]),
               "reported": r["reported"], "started": r["started"], "finished": r["finished"],
               "accuracy": _metric(r["metrics"], "accuracy"), "loss": _metric(r["metrics"], "test_loss"),
               "bytes": round_bytes(r["metrics"]), **_secure(r["metrics"])}
              for r in journaled]
    return {"model": config.model, "strategy": config.strategy, "rounds_total": config.rounds,
            "rounds_done": sum(r["complete"] for r in rounds), "current": current, "rounds": rounds,
            "devices": _devices(server, feed, _last_bytes(journaled)), "notices": [asdict(n) for n in reversed(feed.notices)],
            "privacy": _privacy(journaled), "time": time.time()}


def _secure(metrics: dict | None) -> dict[str, object]:
    """A secure round's summary (orchestrator.aggregation.secure.sums): each block's cohort and whether it was
    revealed, the dropouts whose masks were removed, the protocol's cost; nothing for a plain round."""
    secure = (metrics or {}).get("secure")
    if not isinstance(secure, dict):
        return {}
    keep = ("blocks", "cohort", "masked", "recovered", "presumed_dropped", "messages_in", "bytes_in", "unmask_s")
    return {"secure": {k: secure.get(k) for k in keep}}


def _privacy(rounds: list[dict]) -> dict[str, object] | None:
    """The privacy spent after the last completed round of a DP run (epsilon per block and for the
    model, delta, where the noise was added: ``mode`` central or distributed), as its round's metrics
    say; None for a run without DP."""
    for r in reversed(rounds):
        privacy = (r["metrics"] or {}).get("privacy")
        if r["complete"] and isinstance(privacy, dict):
            keep = ("epsilon", "delta", "blocks", "rounds", "accountant", "target_epsilon", "mode")
            return {k: privacy.get(k) for k in keep}
    return None


def _last_bytes(rounds: list[dict]) -> dict[str, dict[str, object]]:
    """Each device's bytes down, up and held in the last completed round it took part in."""
    out: dict[str, dict[str, object]] = {}
    for r in rounds:
        for device, by in ((r["metrics"] or {}).get("bytes") or {}).items():
            out[device] = {"round": r["round"], **device_bytes(by)}
    return out


def _reported(server: ServerView, feed: StatusFeed) -> dict[str, dict[str, object]]:
    """What each device's last report says: the runtime it trained on (its ``backend`` metric: a
    browser tab planned on WebGPU may have trained on WebAssembly) and the most memory it held
    (``peak_rss_bytes``; a tab cannot read its own), from the journal's rounds of the devices' last reports."""
    out: dict[str, dict[str, object]] = {}
    for rnd in sorted({r["round"] for r in feed.last_report.values() if isinstance(r.get("round"), int)}):
        for update in server.store.reports.all(rnd):
            metrics, mine = update.get("metrics") or {}, out.setdefault(update["device_id"], {})
            if isinstance(metrics.get("backend"), str):
                mine["backend"] = metrics["backend"]
            peak = metrics.get("peak_rss_bytes")
            if isinstance(peak, (int, float)) and peak > 0:
                mine["peak"] = int(peak)
    return out


def _devices(server: ServerView, feed: StatusFeed, spent: Mapping[str, dict[str, object]]) -> list[dict[str, object]]:
    """Journaled devices, the connected ones with what they said in this connection's hello, and
    what their last round cost them in bytes."""
    reported = _reported(server, feed)
    out = []
    for d in server.store.devices.all():
        device_id, profile, plan = d["device_id"], d["profile"], d["plan"]
        session = server.sessions.get(device_id)
        if session is not None:  # what this connection declared and was planned (the journal may lag a turn)
            profile = {**profile, "runtimes": list(session.hello.runtimes), "budget_bytes": session.hello.budget_bytes}
            plan = {**plan, "role": session.plan.role, "split": session.plan.split}
        out.append({"id": device_id, "connected": session is not None, "runtimes": profile.get("runtimes") or [],
                    "device_class": profile.get("device_class", ""), "budget_bytes": profile.get("budget_bytes"),
                    "samples": profile.get("num_samples"), "role": plan.get("role"), "split": plan.get("split"),
                    "backend": plan.get("backend"), "trained_on": reported.get(device_id, {}).get("backend"),
                    "peak_bytes": reported.get(device_id, {}).get("peak"), "last_seen": d["last_seen"],
                    "last_report": feed.last_report.get(device_id), "bytes": spent.get(device_id)})
    return out


def _metric(metrics: Mapping[str, object] | None, name: str) -> float | None:
    value = (metrics or {}).get(name)
    return float(value) if isinstance(value, (int, float)) else None
