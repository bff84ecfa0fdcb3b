"""Flower's SecAgg+ beside its plain FedAvg round, on bench/secagg_fleet.py's workload.

Flower 1.41's simulation engine (``flwr.simulation.run_simulation``, Ray, one CPU per ClientApp, so
two ClientApps at once on two cores) runs ``mnist_2nn`` (784-64-10, the zoo's, 51k parameters) on
MNIST split IID (the devices' own partition code), every client selected every round, one local
step of batch 16, lr 0.1, FedAvg, in two lanes: ``plain`` (``DefaultWorkflow()``) and ``secagg+``
(``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares, reconstruction_threshold))`` with the
clients' ``secaggplus_mod``: Bell et al. 2020, Flower's implementation). ``num_shares`` follows this
project's neighbour count (the whole cohort up to 33 clients, else 3 log2 n) and
``reconstruction_threshold`` 4 or half the shares, whichever is larger (an even count short of the
cohort is made odd, as Flower's own float form does: an even one fails in ``secaggplus_mod``).
Dropouts: a client drawn to drop in a round (seeded by client and round, with probability 0, 10%
or 30%) raises in its ``fit``, which under ``secaggplus_mod`` is after it has shared its keys, so the
workflow recovers its masks (the same point as ``drop_at = "upload"`` here).

Per round it reports the wall time between the strategy's ``configure_fit`` and ``aggregate_fit``
(what the whole SecAgg+ workflow spans) and how many replies were aggregated. Bytes: the
simulation moves messages through Ray's object store, not a network, so nothing counts bytes on a
wire; the JSON gives the model's size instead. ``python bench/secagg_flower.py`` (in this project's
environment) makes Flower's environment as ``bench/vs_flower.py`` does, writes the shards, runs each
case in Flower's environment and writes ``bench/results/secagg_flower.json``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for _p in (ROOT, BENCH):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from bench.harness import Case, Context, interleave, parse_list  # noqa: E402  (the standard library only)


def num_shares(n: int) -> int:
    """This project's neighbour count for a cohort of n (orchestrator ``secure_degree = 0``)."""
    return n if n <= 33 else min(n, math.ceil(3 * math.log2(n)))


def drops(seed: int, client: int, rnd: int, p: float) -> bool:
    import numpy as np

    return bool(np.random.default_rng([seed, client, rnd]).random() < p)


# -- inside Flower's environment -------------------------------------------------------------------
def simulate(s: dict) -> dict:
    """One lane in Flower's simulation engine; each round's times and replies."""
    import numpy as np
    import torch
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import Context
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.simulation import run_simulation

    import fl_common
    from edge_sdk.models import build_model

    def model():
        return build_model("mnist_2nn", seed=s["seed"])

    class Client(NumPyClient):
        def __init__(self, cid: int) -> None:
            self.cid, self.data = cid, fl_common.load_shard(s["shard_dir"], cid)

        def fit(self, parameters, config):
            rnd = int(config["server_round"])
            if drops(s["seed"], self.cid, rnd, s["dropout"]):
                raise RuntimeError(f"client {self.cid} drops in round {rnd}")
            m = model()
            m.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in zip(m.state_dict(), parameters)})
            fl_common.train_local(m, *self.data, steps=1, batch=16, lr=0.1, momentum=0.0,
                                  seed=fl_common.local_seed(s["seed"], rnd, self.cid))
            return [v.detach().numpy() for v in m.state_dict().values()], len(self.data[1]), {}

    rounds: list[dict] = []

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            rounds.append({"round": server_round, "t_start": time.time()})
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            rounds[-1].update(t_end=time.time(), reported=len(results), failures=len(failures))
            return super().aggregate_fit(server_round, results, failures)

    client_app = ClientApp(client_fn=lambda ctx: Client(int(ctx.node_config["partition-id"])).to_client(),
                           mods=[secaggplus_mod] if s["secure"] else [])
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context: Context) -> None:
        from flwr.common import ndarrays_to_parameters

        init = ndarrays_to_parameters([v.numpy() for v in model().state_dict().values()])
        strategy = TimedFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=s["clients"],
                               min_available_clients=s["clients"], accept_failures=True, initial_parameters=init,
                               on_fit_config_fn=lambda r: {"server_round": r})
        ctx = LegacyContext(context=context, config=ServerConfig(num_rounds=s["rounds"]), strategy=strategy)
        shares = num_shares(s["clients"])
        if shares < s["clients"] and shares % 2 == 0:
            # An even count fails in secaggplus_mod (IndexError in _share_keys: the graph gives each
            # client num_shares - 1 neighbours only when that is even); Flower's float form rounds up so.
            shares += 1
        fit = SecAggPlusWorkflow(num_shares=shares, reconstruction_threshold=max(4, shares // 2)) if s["secure"] \
            else None
        (DefaultWorkflow(fit_workflow=fit) if fit else DefaultWorkflow())(grid, ctx)

    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=s["clients"],
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    return {"rounds": rounds}


# -- this project's environment ----------------------------------------------------------------------
def run_lane(flwr_py: Path, s: dict, timeout: float) -> dict:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}:{BENCH}")
    t0 = time.monotonic()
    try:
        proc = subprocess.run([str(flwr_py), __file__, "--lane", json.dumps(s)], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**s, "failed": f"did not finish in {timeout:.0f} s"}
    wall = time.monotonic() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{\"rounds\"")]
    if proc.returncode != 0 or not lines:
        return {**s, "failed": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"}
    res = json.loads(lines[-1])
    walls = [r["t_end"] - r["t_start"] for r in res["rounds"] if "t_end" in r]
    if not walls:
        return {**s, "rounds": res["rounds"], "failed": f"no round aggregated in {wall:.0f} s; the log ends with: "
                                                        f"{(proc.stderr or proc.stdout)[-1500:]}"}
    warm = walls[1:] or walls
    return {**s, "rounds": res["rounds"], "round_wall_s": walls, "mean_wall_s": round(sum(warm) / len(warm), 4),
            "lane_wall_s": round(wall, 1)}


def arguments(ap) -> None:
    import argparse

    ap.add_argument("--clients", default="10,100")
    ap.add_argument("--dropouts", default="0,0.1,0.3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="plain,secure", help="which lanes: plain, secure or both")
    ap.add_argument("--lane-timeout", type=float, default=600)
    ap.add_argument("--flwr-venv", type=Path, default=BENCH / ".venv-flwr")
    ap.add_argument("--lane", default=None, help=argparse.SUPPRESS)


def run(ctx: Context) -> dict | None:
    import vs_flower

    args = ctx.args
    if args.lane:
        print(json.dumps(simulate(json.loads(args.lane))), flush=True)
        return None
    with tempfile.TemporaryDirectory(prefix="secagg-flower-") as tmp:
        flwr_py, note = vs_flower.ensure_flwr_venv(args.flwr_venv.resolve(), Path(tmp) / "pip.log")
        if flwr_py is None:
            raise SystemExit(f"Flower's environment: {note}")
        results = []
        for n in parse_list(args.clients, int):
            shard_dir = Path(tmp) / f"shards-{n}"
            shard_dir.mkdir()
            vs_flower.write_shards({"clients": n, "seed": 0, "data_root": os.environ.get("EDGETRAIN_DATA")}, shard_dir)
            drops = parse_list(args.dropouts, float)
            for rep, mode in interleave(parse_list(args.modes), len(drops)):  # a dropout's lanes side by side
                s = {"clients": n, "dropout": drops[rep], "secure": mode == "secure", "rounds": args.rounds,
                     "seed": 0, "shard_dir": str(shard_dir)}
                results.append(run_lane(flwr_py, s, args.lane_timeout))
                print(json.dumps({k: v for k, v in results[-1].items() if k != "rounds"})[:600], flush=True)
    return ctx.write(results, {"flwr": note, "model_bytes": 50890 * 4})


CASE = Case("secagg_flower", __doc__, run, arguments=arguments, data_root=True,
            quick={"clients": "4", "dropouts": "0", "rounds": 1})


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
