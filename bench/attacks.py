"""One attacker against the default settings, and what the defaults cost an honest fleet.

Live fleets on 127.0.0.1 (``tests/attacks.py``: the production device client, tampering with its
update after honest training), digits_mlp, iid shards of the digits training split cut in 5, seed
0, learning rate 0.1, 10 local steps, every device enrolled and proving its credential:

- **attacks**: 4 honest devices training the whole model (shards 0-3) and one attacker (shard 4),
  each attack of ``tests/attacks.py``, under the default settings; against the same 4 honest
  devices without the attacker. With ``--plain`` each attack also runs against a plain server.
- **honest cost**: honest fleets under the defaults and under a plain server (the mean, no weight
  cap, no norm bound, no validation before commit): ``iid5``, 5 devices training the whole model
  (FedAvg); ``partial``, 2 devices training the whole model and 3 training blocks 2-3 only
  (EmbracingFL partial training).

- **insiders in the demo's fleet** (``--demo``): the hostile kit's fleet shape (tests/attacks.py,
  ``run_demo_fleet``: devices at splits 0, 0 and 2, the insider at split 0 so it shares blocks 0-1
  with two honest devices) under the defaults, each insider against the fleet without it, by the mean
  accuracy of the last five rounds; and the honest fleet with direction trust on and off, with each
  run's wall time (``--seeds`` seeds each). Written to ``bench/results/attacks_demo.json``.

- **free riders in the demo's fleet** (``--free-riders``): three colluding insiders on one shard, each
  sending 0.01 of its honest update, against the honest fleet, under the defaults, by the mean accuracy
  of the last three and the last five rounds (``--seeds`` seeds each). Written to
  ``bench/results/attacks_free_riders.json``.

- **insiders of secure rounds** (``--secure [--group-size 3] [--shards 8] [--secure-lanes ...]``): the
  secure fleet (tests/attacks.py, ``run_secure_fleet``: with the digits training split cut in 8, six
  devices at split 0 and one at split 2, so that the cohort holds two groups of at least 3 that each
  train every block; ``--shards 12`` cuts the same data among 10 + 1 honest devices, three groups)
  under the defaults with secure aggregation in groups of at least ``--group-size``, each insider of ``SECURE_ATTACKS`` against the
  honest secure fleet, and the honest fleet plain; three colluding free riders (0.01 x) with
  ``free_rider``. Per run: the mean accuracy of the last three of 8 rounds, rounds completed, honest
  devices that exited, and how the journal named the insider: rows of its own (a share blamed, seals
  that did not open), rows of its group (a weight word), rounds whose metrics gave its group trust
  below 0.1 in a block, and rounds its group had the lowest trust of the round's groups. Written to
  ``bench/results/attacks_secure.json`` (``attacks_secure_<shards>.json`` for other ``--shards``).

Not a test: ``python bench/attacks.py [--rounds 8] [--plain] [-O key=value ...]`` prints the tables and
writes ``bench/results/attacks.json``. ``-O`` sets strategy options of the "defaults" runs (to
compare candidate defaults). ``python bench/attacks.py --demo [--seeds 0]`` runs the demo fleet's;
``--free-riders [--seeds 0,1]`` its free riders.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, interleave  # noqa: E402
from bench.harness.journal import updates  # noqa: E402
from tests.attacks import (ATTACKS, PLAIN, PLAIN_OPTIONS, ROUNDS_DEMO, SECURE_ATTACKS, SECURE_SHARDS,  # noqa: E402
                           FleetDevice, run_demo_fleet, run_fleet, run_secure_fleet)

HONEST = tuple(FleetDevice(f"strong-{i}", i) for i in range(4))
FLEETS = {
    "iid5": ("fedavg", tuple(FleetDevice(f"strong-{i}", i) for i in range(5))),
    "partial": ("embracingfl", tuple(FleetDevice(f"strong-{i}", i) for i in range(2))
                + tuple(FleetDevice(f"weak-{i}", i + 2, split=2) for i in range(3))),
}


def _run(root: Path, name: str, devices, *, plain: bool, options: dict, rounds: int,
         strategy: str = "embracingfl") -> dict:
    t0 = time.monotonic()
    result = run_fleet(root / name, devices, aggregation=None, rounds=rounds, credentials=True, strategy=strategy,
                       options=PLAIN_OPTIONS if plain else options, settings=PLAIN if plain else None)
    last = result.history[-1]
    bounded = [u for u in updates(root / name) if u.get("bounded")]
    row = {"run": name, "accuracy": round(100 * result.accuracy, 2), "wall_s": round(time.monotonic() - t0, 1),
           "honest_bounded": sum(u["device_id"] != "attacker" for u in bounded),
           "attacker_bounded": sum(u["device_id"] == "attacker" for u in bounded),
           "failed_rounds": sum("failed" in h for h in result.history),
           "retried_rounds": sum(bool(h.get("retried")) for h in result.history),
           "aggregation": last.get("aggregation", "mean")}
    print(json.dumps(row), flush=True)
    return row


INSIDERS = ("sign_flip", "constant", "boost100", "inflated", "lone")


def _demo_run(root: Path, attack: str | None, trust: bool, seed: int, insiders: int = 1) -> dict:
    name = f"{attack or 'honest'}-{'trust' if trust else 'off'}-{seed}"
    t0 = time.monotonic()
    result = run_demo_fleet(root / name, attack, trust=trust, seed=seed, insiders=insiders)
    row = {"run": name, "last5": round(100 * result.mean_accuracy(), 2), "last3": round(100 * result.mean_accuracy(3), 2),
           "final": round(100 * result.accuracy, 2),
           "wall_s": round(time.monotonic() - t0, 1), "failed_rounds": sum("failed" in h for h in result.history)}
    print(json.dumps(row), flush=True)
    return row


DEMO_LANES = ("honest-trust", "honest-off", *INSIDERS)


def demo(ctx: Context) -> dict:
    """The demo fleet's insiders and the honest cost of direction trust (module docstring)."""
    seeds, runs = ctx.seeds, []
    with tempfile.TemporaryDirectory() as tmp:  # a seed's runs side by side, the first one rotating
        for rep, lane in interleave(DEMO_LANES, len(seeds)):
            attack, trust = (None, lane == "honest-trust") if lane.startswith("honest") else (lane, True)
            runs.append({"seed": seeds[rep], "attack": attack, "trust": trust,
                         **_demo_run(Path(tmp), attack, trust, seeds[rep])})

    def mean(key: str, attack: str | None, trust: bool = True) -> float:
        vals = [r[key] for r in runs if r["attack"] == attack and r["trust"] == trust]
        return sum(vals) / len(vals)

    honest = mean("last5", None)
    print("\n| insider | honest fleet (%) | with the insider (%) | points moved |")
    for a in INSIDERS:
        print(f"| {a} | {honest:.2f} | {mean('last5', a):.2f} | {mean('last5', a) - honest:+.2f} |")
    off = mean("last5", None, False)
    ratio = mean("wall_s", None) / mean("wall_s", None, False)
    print(f"\nhonest fleet: trust on {honest:.2f} %, off {off:.2f} % ({honest - off:+.2f} points); "
          f"wall time on/off {ratio:.2f}x")
    return ctx.write(runs, {"rounds": ROUNDS_DEMO, "seeds": seeds, "honest_on": honest, "honest_off": off,
                            "wall_ratio": round(ratio, 3),
                            "moved": {a: round(mean("last5", a) - honest, 2) for a in INSIDERS}})


def free_riders(ctx: Context) -> dict:
    """Three colluding free riders (0.01 x) in the demo's fleet against the honest fleet (module docstring)."""
    seeds, runs = ctx.seeds, []
    with tempfile.TemporaryDirectory() as tmp:
        for rep, lane in interleave(("honest", "free_rider"), len(seeds)):
            attack = None if lane == "honest" else lane
            runs.append({"seed": seeds[rep], "attack": attack,
                         **_demo_run(Path(tmp), attack, True, seeds[rep], insiders=1 if attack is None else 3)})

    def mean(key: str, attack: str | None) -> float:
        vals = [r[key] for r in runs if r["attack"] == attack]
        return sum(vals) / len(vals)

    moved = {k: round(mean(k, "free_rider") - mean(k, None), 2) for k in ("last3", "last5")}
    print("\n| fleet | last 3 rounds (%) | last 5 rounds (%) |")
    for attack, label in ((None, "honest"), ("free_rider", "with 3 free riders (0.01 x)")):
        print(f"| {label} | {mean('last3', attack):.2f} | {mean('last5', attack):.2f} |")
    print(f"| points moved | {moved['last3']:+.2f} | {moved['last5']:+.2f} |")
    return ctx.write(runs, {"rounds": ROUNDS_DEMO, "seeds": seeds, "insiders": 3, "scale": 0.01, "moved": moved})


SECURE_LANES = ("honest", "sign_flip", "noclip_x-3", "noclip_x100", "weight_word", "honest-plain", "free_rider",
                "boost100", "constant", "bad_seals", "wrong_shares")


def _named(store_dir: Path, history: list[dict], insiders: list[str]) -> dict:
    """How the journal named the insiders: rows of their own (a refusal, a share blamed), rows of a group
    holding one (its weight word), rounds where a group holding one was weighed below 0.1 in some block."""
    from orchestrator.store import Store

    with Store(store_dir) as store:
        rows = store.reports.all()
    own = sum(1 for u in rows if u["device_id"] in insiders and (u.get("accepted") is False or u.get("phase") == "secagg"))
    group = sum(1 for u in rows if u["device_id"].startswith("group") and any(i in str(u.get("reason")) for i in insiders))
    low = lowest = 0
    for h in history:
        groups = h.get("secure", {}).get("groups", [])
        trust = [min(g.get("trust", {"": 1.0}).values()) for g in groups]
        hostile = [t for g, t in zip(groups, trust) if any(i in g.get("members", ()) for i in insiders)]
        low += any(t < 0.1 for t in hostile)
        lowest += bool(hostile) and len(groups) > 1 and min(hostile) == min(trust) and min(trust) < max(trust)
    return {"own_rows": own, "group_rows": group, "rounds_low_trust": low, "rounds_lowest_trust": lowest}


def _secure_run(root: Path, lane: str, group_size: int, seed: int, shards: int, group_norm: str | None) -> dict:
    attack = None if lane.startswith("honest") else lane
    insiders = 3 if attack == "free_rider" else 1
    t0 = time.monotonic()
    result = run_secure_fleet(root / lane, attack, secure=lane != "honest-plain", group_size=group_size, seed=seed,
                              insiders=insiders, shards=shards, group_norm=group_norm)
    names = ["attacker"] if insiders == 1 else [f"attacker-{i}" for i in range(insiders)]
    row = {"run": lane, "last3": round(100 * result.mean_accuracy(3), 2), "final": round(100 * result.accuracy, 2),
           "rounds": len(result.history), "failed_rounds": sum("failed" in h for h in result.history),
           "honest_exited": sorted(d for d in result.errors if d not in names),
           "groups": [len(g["members"]) for g in result.history[-1].get("secure", {}).get("groups", [])],
           "accuracy_by_round": [round(100 * h["accuracy"], 2) for h in result.history],
           "wall_s": round(time.monotonic() - t0, 1), **(_named(root / lane, result.history, names) if attack else {})}
    print(json.dumps(row), flush=True)
    return row


def secure(ctx: Context) -> dict:
    """Insiders of secure rounds in groups, against the honest secure fleet (module docstring)."""
    args, runs = ctx.args, []
    lanes = [lane for lane in args.secure_lanes.split(",") if lane in SECURE_LANES]  # in the order given
    summary = {"rounds": ROUNDS_DEMO, "seeds": ctx.seeds, "group_size": args.group_size, "shards": args.shards,
               "group_norm": args.group_norm or "default",
               "attacks": sorted(SECURE_ATTACKS)}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in ctx.seeds:
            for lane in lanes:  # minutes a run: the rows so far are written after each
                row = _secure_run(Path(tmp) / f"seed-{seed}", lane, args.group_size, seed, args.shards, args.group_norm)
                runs.append({"seed": seed, **row})
                ctx.write(runs, summary, quiet=True)
    honest = {r["seed"]: r["last3"] for r in runs if r["run"] == "honest"}
    print(f"\n| run (group size {args.group_size}) | last 3 of 8 rounds (%) | points vs honest secure | rounds | "
          "honest exited | named |")
    for r in runs:
        moved = f"{r['last3'] - honest[r['seed']]:+.2f}" if r["seed"] in honest else "-"
        named = "" if "own_rows" not in r else (f"{r['own_rows']} own, {r['group_rows']} group, {r['rounds_low_trust']} "
                                                f"below 0.1, {r['rounds_lowest_trust']} lowest")
        print(f"| {r['run']} | {r['last3']:.2f} | {moved} | {r['rounds']} | {len(r['honest_exited'])} | {named} |")
    return ctx.write(runs, summary)


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--plain", action="store_true", help="also run each attack against a plain server")
    ap.add_argument("--attacks", default=",".join(a for a in ATTACKS if a not in ("boost10", "free_rider")))
    ap.add_argument("--skip-honest-cost", action="store_true")
    ap.add_argument("-O", dest="options", action="append", default=[], help="strategy option of the defaults runs")
    ap.add_argument("--free-riders", action="store_true", help="three colluding free riders (0.01 x) in the demo "
                    "fleet (--seeds: its seeds; results in bench/results/attacks_free_riders.json)")
    ap.add_argument("--secure", action="store_true", help="insiders of secure rounds in groups (--group-size, "
                    "--secure-lanes, --seeds, --shards; results in bench/results/attacks_secure[_<shards>].json)")
    ap.add_argument("--group-size", type=int, default=3, help="secure_group_size of the --secure runs (0: one group)")
    ap.add_argument("--group-norm", choices=("own", "reference"), default=None,
                    help="secure_group_norm of the --secure runs (default: the server's)")
    ap.add_argument("--shards", type=int, default=SECURE_SHARDS, help="--secure: the digits training split cut in this "
                    "many shards, one device each (shards - 2 at split 0, one at split 2, the insider on the last); "
                    "results in bench/results/attacks_secure_<shards>.json unless 8")
    ap.add_argument("--secure-lanes", default=",".join(SECURE_LANES), help="the --secure runs, in this order")
    ap.add_argument("--demo", action="store_true", help="the demo fleet's insiders and direction trust's honest cost "
                    "(--seeds: its seeds; results in bench/results/attacks_demo.json)")


def run(ctx: Context) -> dict:
    args = ctx.args
    if args.secure:
        return secure(ctx)
    if args.demo:
        return demo(ctx)
    if args.free_riders:
        return free_riders(ctx)
    options = dict(o.split("=", 1) for o in args.options)
    out: dict[str, object] = {"rounds": args.rounds, "options": options, "attacks": [], "honest_cost": []}
    runs: list[dict] = []

    def one(name: str, devices, *, plain: bool, strategy: str = "embracingfl") -> dict:
        runs.append(_run(root, name, devices, plain=plain, options=options, rounds=args.rounds, strategy=strategy))
        return runs[-1]

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        honest = one("honest-defaults", HONEST, plain=False) if args.attacks else {"accuracy": None}
        for attack in filter(None, args.attacks.split(",")):
            devices = HONEST + (FleetDevice("attacker", 4, attack=ATTACKS[attack]),)
            row = {"attack": attack, "honest": honest["accuracy"],
                   "defaults": one(f"{attack}-defaults", devices, plain=False)}
            if args.plain:
                row["plain"] = one(f"{attack}-plain", devices, plain=True)
            out["attacks"].append(row)
        if not args.skip_honest_cost:
            for fleet, (strategy, devices) in FLEETS.items():  # each fleet's two settings side by side
                out["honest_cost"].append({
                    "fleet": fleet, "strategy": strategy,
                    **{lane: one(f"{fleet}-{lane}", devices, plain=lane == "plain", strategy=strategy)
                       for lane in ("defaults", "plain")}})
    print("\n| attack | honest fleet (%) | with the attacker, defaults (%) | points lost |"
          + (" plain server (%) |" if args.plain else ""))
    for r in out["attacks"]:
        d = r["defaults"]["accuracy"]
        plain = f" {r['plain']['accuracy']} |" if "plain" in r else ""
        print(f"| {r['attack']} | {r['honest']} | {d} | {r['honest'] - d:.2f} |{plain}")
    print("\n| fleet | strategy | plain (%) | defaults (%) | points lost |")
    for r in out["honest_cost"]:
        p, d = r["plain"]["accuracy"], r["defaults"]["accuracy"]
        print(f"| {r['fleet']} | {r['strategy']} | {p} | {d} | {p - d:.2f} |")
    return ctx.write(runs, out)


def results_name(args: argparse.Namespace) -> str:
    """attacks[_secure|_demo|_free_riders]"""
    secure = "attacks_secure" + ("" if args.shards == SECURE_SHARDS else f"_{args.shards}")
    return secure if args.secure else "attacks_demo" if args.demo else "attacks_free_riders" if args.free_riders else "attacks"


CASE = Case("attacks", __doc__, run, arguments=arguments, seeds="0", results=results_name,
            quick={"rounds": 2, "attacks": "boost100", "skip_honest_cost": True})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
