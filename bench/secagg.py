"""Secure aggregation's computation and bytes beside the plain round's, in one process.

``python bench/secagg.py [--devices 10,100] [--params 100000] [--blocks 4] [--dropouts 0,0.1,0.3]``
runs one secure round of ``n`` devices over a model of ``--params`` float32 coordinates in
``--blocks`` equal blocks (every device trains every block; a dropped device vanishes after sharing
its keys), through the real messages' codec, and the plain round beside it: each device encodes its
float32 update (``encode_tensors``) and the server decodes and sums them. It reports per device the
CPU seconds of its steps and the bytes it sends, and for the server the CPU seconds of its stages
(the JSON adds the bytes of its running sums: the server keeps one sum per block, not the devices'
uploads), and writes ``bench/results/secagg.json``. Wall time equals CPU time here: one process,
no network; the round's network time is the transport's (``bench/transport.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, parse_list  # noqa: E402
from edge_sdk import protocol as p  # noqa: E402
from edge_sdk.secagg import Scope, identity_public_key  # noqa: E402
from edge_sdk.secagg.round import DeviceRound  # noqa: E402
from orchestrator.aggregation.secure import round as server_round  # noqa: E402  (the server's stages: what is measured)


def _wire(msg: p.Message) -> tuple[p.Message, int]:
    data = p.encode(msg)
    return p.decode(data), len(data)


def plain_round(n: int, sizes: dict[int, int], rng: np.random.Generator) -> dict[str, float]:
    device_s = server_s = 0.0
    names = {b: f"blocks.b{b}.weight" for b in sizes}
    total = {b: np.zeros(s, np.float64) for b, s in sizes.items()}
    for _ in range(n):
        update = {names[b]: rng.normal(0, 0.01, s).astype(np.float32) for b, s in sizes.items()}
        t = time.process_time()
        data = p.encode_tensors(update)
        device_s += time.process_time() - t
        t = time.process_time()
        got = p.decode_tensors(data)
        for b in sizes:
            total[b] += got[names[b]]
        server_s += time.process_time() - t
    return {"device_cpu_s": device_s / n, "server_cpu_s": server_s, "upload_bytes": len(data)}


def secure_round(n: int, sizes: dict[int, int], dropout: float, rng: np.random.Generator) -> dict[str, object]:
    scope, ids = Scope("bench", 1), [f"d{i:04d}" for i in range(n)]
    roster = {d: identity_public_key(f"s-{d}", d) for d in ids}
    server = server_round.SecureRound(scope, len(sizes), sizes, clip=1.0, identities=roster)
    devices = {d: DeviceRound(d, f"s-{d}", scope, 0, len(sizes)) for d in ids}
    cpu = dict.fromkeys(ids, 0.0)
    sent = dict.fromkeys(ids, 0)
    server_s = 0.0

    def device_step(d, fn):
        t = time.process_time()
        out = fn()
        cpu[d] += time.process_time() - t
        return out

    def server_step(fn):
        nonlocal server_s
        t = time.process_time()
        out = fn()
        server_s += time.process_time() - t
        return out

    for d, dev in devices.items():
        msg, size = _wire(p.SecAggKeys(1, *device_step(d, dev.advertise)))
        sent[d] += size
        server_step(lambda: server.advertise(d, 0, msg.cipher_public, msg.mask_public, msg.signature, msg.commitments))
    peers = server_step(lambda: server.close_keys(weight_scale=100.0))
    for d, fields in peers.items():
        msg, _ = _wire(p.SecAggPeers(round=1, **fields))
        shares, size = _wire(p.SecAggShares(1, device_step(d, lambda: devices[d].share(msg))))
        sent[d] += size
        server_step(lambda: server.take_shares(d, shares.sealed))
    inbox = server_step(server.close_shares)
    dropped = set(rng.choice(ids, int(round(dropout * n)), replace=False)) if dropout else set()
    upload = 0
    for d, sealed in inbox.items():
        if d in dropped:
            continue
        device_step(d, lambda: devices[d].receive(sealed))
        update = [rng.normal(0, 0.01, s) for s in sizes.values()]
        words = device_step(d, lambda: devices[d].mask(update, 50))
        data = device_step(d, lambda: p.encode_tensors({f"secagg.{b}": w.view("<i4") for b, w in enumerate(words)}))
        upload = len(data)
        sent[d] += upload
        got = server_step(lambda: p.decode_tensors(data))
        server_step(lambda: server.take_masked(d, {b: got[f"secagg.{b}"].view(np.uint32) for b in sizes}))
    asks = server_step(server.close_uploads)
    survivors = server_step(server.survivor_set)
    for d in asks:  # ConsistencyCheck: each survivor signs the survivor set
        msg, size = _wire(p.SecAggReveal(1, {}, {}, device_step(d, lambda: devices[d].consent(survivors))))
        sent[d] += size
        server_step(lambda: server.take_consent(d, msg.consent))
    for d, (alive, gone, blocks) in asks.items():
        signatures = server_step(lambda: server.signatures_for(d))
        seeds, keys = device_step(d, lambda: devices[d].reveal(alive, gone, blocks, survivors, signatures))
        msg, size = _wire(p.SecAggReveal(1, seeds, keys))
        sent[d] += size
        server_step(lambda: server.take_reveal(d, msg.seed_shares, msg.key_shares))
    outcomes = server_step(server.finish)
    live = [d for d in ids if d not in dropped]
    return {"device_cpu_s": float(np.mean([cpu[d] for d in live])), "server_cpu_s": server_s, "upload_bytes": upload,
            "protocol_bytes": float(np.mean([sent[d] for d in live])) - upload,
            "server_sums_bytes": sum(4 * (s + 1) for s in sizes.values()),
            "revealed": sum(o.values is not None for o in outcomes), "degree": len(next(iter(peers.values()))["cipher_keys"])}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--devices", default="10,100")
    ap.add_argument("--params", type=int, default=100_000)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--dropouts", default="0,0.1,0.3")


def run(ctx: Context) -> dict:
    args = ctx.args
    sizes = {b: args.params // args.blocks for b in range(args.blocks)}
    rng = np.random.default_rng(0)
    rows = []
    print("| devices | dropout | degree | device CPU s (secure / plain) | server CPU s (secure / plain) | "
          "upload bytes (secure / plain) | key and share bytes per device | blocks revealed |")
    print("|---|---|---|---|---|---|---|---|")
    for n in parse_list(args.devices, int):
        plain = plain_round(n, sizes, rng)
        for dropout in parse_list(args.dropouts, float):
            sec = secure_round(n, sizes, dropout, rng)
            rows.append({"devices": n, "dropout": dropout, "params": args.params, "plain": plain, "secure": sec,
                         **{f"{who}_cpu_ratio": sec[f"{who}_cpu_s"] / plain[f"{who}_cpu_s"] if plain[f"{who}_cpu_s"] else None
                            for who in ("device", "server")}})
            print(f"| {n} | {dropout:.0%} | {sec['degree']} | {sec['device_cpu_s']:.3f} / {plain['device_cpu_s']:.4f} | "
                  f"{sec['server_cpu_s']:.2f} / {plain['server_cpu_s']:.3f} | {sec['upload_bytes']} / "
                  f"{plain['upload_bytes']} | {sec['protocol_bytes']:.0f} | {sec['revealed']} of {args.blocks} |",
                  flush=True)
    return ctx.write(rows, {"blocks": args.blocks, "params": args.params})


CASE = Case("secagg", __doc__, run, arguments=arguments, quick={"devices": "5", "params": 1000, "dropouts": "0,0.2"})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
