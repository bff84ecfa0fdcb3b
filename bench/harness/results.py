"""The one results schema of the benchmarks: what a run of a case writes to ``bench/results/<case>.json``.

Every benchmark writes one JSON document of this shape (:data:`SCHEMA`), so that a number in
BENCHMARKS.md can be traced to the command, the machine, the date and the code that measured it::

    {
      "schema": "edgetrain-bench/1",
      "case": "transport",                      # the case's name (the file's stem by default)
      "command": "python bench/transport.py --sizes 1",
      "options": {"sizes": "1", "repeats": 15, ...},   # every option as parsed (defaults included)
      "machine": {"cores": 2, "cpu": "AMD EPYC ...", "memory_gib": 23.5, "platform": "...",
                  "python": "3.11.2", "load_average": [7.9, 8.1, 8.0]},
      "date": "2026-12-07T10:31:02Z",           # when the run started (UTC)
      "commit": "3d487fd...", "dirty": false,  # the checkout's HEAD, and whether tracked files differed
      "wall_s": 42.1,
      "runs": [{"lane": "bare", "repeat": 0, "size_mib": 1, "seconds": 0.0004}, ...],
      "summary": {"seconds": [{"lane": "bare", "size_mib": 1, "n": 15, "median": ..., "min": ...,
                               "max": ..., "q1": ..., "q3": ..., "interval": [low, high]}], ...},
      "report": {...}                           # the case's own tables (whatever its readers need)
    }

``runs`` holds one record per measured run (a lane of one repeat, one seed, one configuration);
``summary`` the statistics of the case's metrics over those runs (:func:`summarise`), and where a
case compares lanes, the per-repeat ratios (:func:`ratio_summary`: on a shared, noisy machine a
ratio measured within one repeat moves far less than either number). ``interval`` is a
distribution-free 95 % confidence interval of the median (order statistics of the binomial, as in
Conover, *Practical Nonparametric Statistics*, 3.2), null below 6 runs.

Only the standard library is imported here: ``bench/gpu_check.sh`` and Flower's own environment run
benchmarks without the project installed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "commit", "document", "load", "machine", "median_interval", "ratio_summary", "report_of",
           "runs_of", "stats", "summarise", "write"]

SCHEMA = "edgetrain-bench/1"
ROOT = Path(__file__).resolve().parents[2]


def machine() -> dict[str, Any]:
    """The machine a run measured: cores, CPU model, memory, OS, Python, and the load when it started."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(memory / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(), "load_average": load}


def commit(root: Path = ROOT) -> tuple[str | None, bool]:
    """The checkout's HEAD and whether a tracked file differs from it (None, False outside a git checkout)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    return sha, bool(sha and git("status", "--porcelain", "--untracked-files=no"))


# -- statistics ------------------------------------------------------------------------------------------
def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval of the median: the order statistics x_(k) and x_(n-k+1) where k is
    the largest rank with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. None when n is too small
    for any such k (n < 6 at 95 %)."""
    xs = sorted(values)
    n = len(xs)
    tail, k, cumulative = (1.0 - confidence) / 2, 0, 0.0
    while k < n:
        nxt = cumulative + math.comb(n, k) / 2.0**n  # P(B <= k)
        if nxt > tail:
            break
        cumulative, k = nxt, k + 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default quantile)."""
    pos = q * (len(xs) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (pos - low)


def stats(values: Iterable[float]) -> dict[str, Any]:
    """n, median, min, max, quartiles and the median's interval of the finite numbers among ``values``."""
    xs = sorted(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v))
    if not xs:
        return {"n": 0}
    interval = median_interval(xs)
    return {"n": len(xs), "median": _quantile(xs, 0.5), "min": xs[0], "max": xs[-1], "q1": _quantile(xs, 0.25),
            "q3": _quantile(xs, 0.75), "interval": list(interval) if interval else None}


def _groups(runs: Iterable[Mapping[str, Any]], by: Sequence[str]) -> dict[tuple, list[Mapping[str, Any]]]:
    out: dict[tuple, list[Mapping[str, Any]]] = {}
    for run in runs:
        out.setdefault(tuple(run.get(k) for k in by), []).append(run)
    return out


def summarise(runs: Sequence[Mapping[str, Any]], metrics: Sequence[str], by: Sequence[str] = ()
              ) -> dict[str, list[dict[str, Any]]]:
    """Per metric, one row per group of runs (the values of ``by``): the group's keys and :func:`stats`."""
    groups = _groups(runs, by)
    return {m: [{**dict(zip(by, key)), **stats(r.get(m) for r in rows)} for key, rows in groups.items()
                if any(m in r for r in rows)] for m in metrics}


def ratio_summary(runs: Sequence[Mapping[str, Any]], metric: str, base: str, *, lane: str = "lane",
                  pair: Sequence[str] = ("repeat",), by: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Each lane's ``metric`` over the ``base`` lane's, paired by ``pair`` (a repeat's lanes ran side by
    side): per lane and group, :func:`stats` of the per-pair ratios."""
    rows = []
    for key, group in _groups(runs, by).items():
        bases = {tuple(r.get(k) for k in pair): r.get(metric) for r in group if r.get(lane) == base}
        lanes = dict.fromkeys(r.get(lane) for r in group if r.get(lane) != base)
        for name in lanes:
            ratios = [r[metric] / bases[p] for r in group if r.get(lane) == name and metric in r
                      and (p := tuple(r.get(k) for k in pair)) in bases and bases[p]]
            rows.append({**dict(zip(by, key)), lane: name, "over": base, **stats(ratios)})
    return rows


# -- the document --------------------------------------------------------------------------------------
def document(case: str, *, command: str, options: Mapping[str, Any], started: float, runs: Sequence[Mapping],
             summary: Mapping[str, Any], report: Mapping[str, Any] | None) -> dict[str, Any]:
    """A results document of :data:`SCHEMA` (``started``: the run's ``time.time()`` at its start)."""
    sha, dirty = commit()
    return {"schema": SCHEMA, "case": case, "command": command, "options": _plain(options), "machine": machine(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "commit": sha, "dirty": dirty,
            "wall_s": round(time.time() - started, 1), "runs": _plain(list(runs)), "summary": _plain(summary),
            "report": _plain(report or {})}


def _plain(value: Any) -> Any:
    """JSON's types: paths as strings, tuples as lists, mapping keys as strings, numpy scalars as numbers."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    return value


def write(path: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` to ``path`` (its folder created; atomically: a reader sees the old file or the new;
    a value JSON has no type for, as its text)."""
    from edge_sdk.fileio import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(doc, indent=1, default=str) + "\n").encode(), durable=False)
    return path


def load(path: Path | str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def report_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A results file's own tables: ``report`` of a :data:`SCHEMA` document, the whole of an older file."""
    return dict(doc["report"]) if doc.get("schema") == SCHEMA else dict(doc)


def runs_of(doc: Mapping[str, Any], older: str = "runs") -> list[Any]:
    """A results file's per-run records: ``runs`` of a :data:`SCHEMA` document, ``older`` of an older file."""
    return list(doc["runs"]) if doc.get("schema") == SCHEMA else list(doc.get(older) or [])
