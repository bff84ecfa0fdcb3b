"""Where the lightweight lane's CPU goes: a py-spy profile of ``bench/vs_flower.py``, per process and phase.

py-spy (``pip install py-spy``; not a dependency of the project) samples every Python thread of the
lane's processes from outside, so nothing in the server or the workers changes to be profiled::

    py-spy record --subprocesses --format raw -r 100 -o light.txt -- \\
        .venv/bin/python bench/vs_flower.py --lanes ours-light --rounds 10 --noise-runs 0
    .venv/bin/python bench/light_phases.py light.txt   # writes bench/results/light_phases.json

The raw file holds one line per distinct stack (its processes' command lines first) and its sample
count. Each stack is put in one process (the lane's server process, ``--lane ours-light``, or a
worker, ``emulator.lightweight``) and one phase, by the first rule of :data:`SERVER` or :data:`WORKER`
whose frame names it contains; stacks ending in a wait (a selector, a thread pool's queue, a lock)
count as idle: py-spy's own idle detection misses threads that wait in C. Start-up (imports, data,
the orchestrator's set-up) and the final evaluation are printed apart from the rounds' phases. A
sample is a thread seen running, not a CPU second: on a loaded machine a thread waiting for a core
counts, so the shares are read against the lane's CPU per round that the bench measures.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context  # noqa: E402

#: (phase, frame names): the first rule one of whose names is in a stack takes it.
SERVER = (
    ("start-up", ("_find_and_load", "Orchestrator.__init__", "start_orchestrator", "load_dataset", "measure_model")),
    ("reference update (norm bound, direction trust)", ("ReferenceUpdate", "NormBound.begin_round")),
    ("evaluation", ("Evaluator.", "CommitCheck.score", "CommitCheck.evaluation")),
    ("commit checks (chunk export, finite values)", ("check_state", "check_chunks")),
    ("payload preparation (cut, encode, hash)", ("Payloads.prepare", "state_version", "Payloads.begin")),
    ("report receive, decode, value checks", ("Intake.receive", "Uploads.", "recv_payload", "decode_tensors")),
    ("report check and fold", ("Intake.fold", "RoundLoop._fold")),
    ("aggregate and commit", ("aggregate", "commit", "Store.", "sqlite")),
    ("payload sending", ("send_payload", "_send_raw", "Channel.send", "send_msg")),
    ("websocket reads, event loop", ("",)),
)
WORKER = (
    ("start-up", ("_find_and_load", "_local_data", "load_runtimes")),
    ("training", ("train_tail",)),
    ("payload store (a download kept by sha256)", ("PayloadStore.",)),
    ("loading the round's state into a tail", ("TorchBackend.prepare", "_TailSource.state", "_loaded")),
    ("download (receive, sha256, decode)", ("Downloads.fetch", "recv_payload", "IncomingTransfer", "decode_tensors")),
    ("upload (encode, send)", ("_upload", "send_payload", "encode_parts", "encode_tensors")),
    ("websocket reads, event loop", ("",)),
)
#: Leaf frames of a thread that waits (py-spy may still report it active).
IDLE = ("_worker (concurrent", "EpollSelector.select", "_do_waitpid", "Condition.wait", "Event.wait",
        "_wait_for_tstate_lock", "Thread._bootstrap")
APART = ("start-up", "evaluation", "idle")


def phase_of(rules, stack: str) -> str:
    leaf = stack.rsplit(";", 1)[-1]
    if not leaf.strip() or leaf.startswith("process ") or any(x in leaf for x in IDLE):
        return "idle"
    return next(name for name, needles in rules if any(n in stack for n in needles))


def tally(lines) -> dict[str, Counter]:
    """Samples per process kind (server, workers) and phase, from py-spy's raw lines."""
    out: dict[str, Counter] = defaultdict(Counter)
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        procs = [f for f in stack.split(";") if f.startswith("process ")]
        if not procs or not count.isdigit():
            continue
        if "emulator.lightweight" in procs[-1]:
            kind, rules = "workers", WORKER
        elif re.search(r"--lane \S", procs[-1]):
            kind, rules = "server", SERVER
        else:
            continue
        out[kind][phase_of(rules, stack)] += int(count)
    return out


def table(counts: dict[str, Counter]) -> str:
    """Per process, each phase's samples and its share of the rounds' samples (start-up,
    evaluation and idle apart)."""
    rows = ["| process | phase | samples | share of the rounds' samples |", "|---|---|---|---|"]
    for kind in ("server", "workers"):
        c = counts.get(kind, Counter())
        rounds = sum(v for k, v in c.items() if k not in APART) or 1
        for phase, n in sorted(c.items(), key=lambda kv: (kv[0] in APART, -kv[1])):
            share = "-" if phase in APART else f"{100 * n / rounds:.1f} %"
            rows.append(f"| {kind} | {phase} | {n} | {share} |")
    return "\n".join(rows)


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("profile", type=Path, help="py-spy's raw output (record --format raw) of a vs_flower ours-light run")


def run(ctx: Context) -> dict:
    with open(ctx.args.profile) as f:
        counts = tally(f)
    text = table(counts)
    print(text)
    runs = [{"process": kind, "phase": phase, "samples": n} for kind, c in counts.items() for phase, n in c.items()]
    return ctx.write(runs, {"profile": str(ctx.args.profile), "table": text})


CASE = Case("light_phases", __doc__, run, arguments=arguments)


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
