"""Write device shards of a dataset as .npz files (x, y) for JavaScript devices (docs/js-device.md).

    PYTHONPATH=. python edge_sdk_js/test/shards.py --data digits --num-clients 4 --out /tmp/shards 1 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from edge_sdk.cli import load_shard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("clients", nargs="+", type=int, help="client indices in the partition")
    ap.add_argument("--data", default="digits")
    ap.add_argument("--num-clients", type=int, required=True)
    ap.add_argument("--partition", default="iid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for client in args.clients:
        x, y = load_shard(args.data, client=client, num_clients=args.num_clients, partition=args.partition, seed=args.seed)
        np.savez(args.out / f"{args.data}-{client}.npz", x=np.ascontiguousarray(x), y=np.ascontiguousarray(y))
        print(args.out / f"{args.data}-{client}.npz", x.shape, x.dtype, y.dtype)


if __name__ == "__main__":
    main()
