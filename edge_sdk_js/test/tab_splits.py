"""The splits the planner gives a browser tab, for every zoo model: JSON ``["model:split", ...]``.

A tab trains from training graphs (runtime ``onnxruntime-webgpu`` or ``onnxruntime-web``); for each
model, every split the planner chooses for a budget between 128 MiB and 2 GiB (the device page's
range; 8 MiB apart) among the splits with no static refusal (exporters.train_export). The WebGPU
conformance test runs these cases.

    PYTHONPATH=. python edge_sdk_js/test/tab_splits.py [--runtimes onnxruntime-webgpu,onnxruntime-web]
"""

from __future__ import annotations

import argparse
import json

from edge_sdk.models.zoo import MODEL_NAMES, build_model
from exporters.train_export import train_graph_refusal
from profiles.accounting import measure_model
from profiles.planner import PlanError, plan_split

_MiB = 1 << 20


#: Zoo models left out: their tails' graphs take minutes each to export, and are made of the same
#: operators as ``char_transformer_tiny``'s, which is in.
LEFT_OUT = frozenset({"char_transformer", "char_transformer_phone"})


def tab_splits(runtime: str, budgets: range = range(128, 2049, 8)) -> list[str]:
    out = []
    for name in MODEL_NAMES:
        if name in LEFT_OUT:
            continue
        model = build_model(name)
        graphs = [k for k in range(len(model)) if train_graph_refusal(model, k) is None]
        if not graphs:
            continue
        cost = measure_model(model)
        splits = set()
        for budget in budgets:
            try:
                splits.add(plan_split(cost, budget * _MiB, 32, backends=(runtime,), graph_splits=graphs).split)
            except PlanError:
                continue
        out += [f"{name}:{k}" for k in sorted(splits)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtimes", default="onnxruntime-webgpu,onnxruntime-web")
    args = ap.parse_args()
    cases: list[str] = []
    for runtime in args.runtimes.split(","):
        cases += [c for c in tab_splits(runtime) if c not in cases]
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
