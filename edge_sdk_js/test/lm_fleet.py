"""The language-model fleet of lm-fleet.test.mjs: each device's own text (a speaking role of Tiny
Shakespeare, as a UTF-8 file) and the budget that buys each runtime its part, as JSON.

Budgets come from the server's own planner (profiles.planner) for the windows each text gives: the
least budget at which the Python torch device and the Node device are planned to train the whole
model, and at which the Python ONNX Runtime device and the tab (onnxruntime-web) are planned to train
its blocks through their LoRA adapters (for the test-sized model and a few hundred windows, the
cheapest plan of all: raw token ids in, no cached activations).

The training graphs the devices without torch are planned on are exported into ``DIR/store/train_graphs``
(the server's graph cache in its store), so the server plans their hellos at once: exporting them
while the devices wait can outlast the server's wait for devices on a loaded machine.

    PYTHONPATH=. python edge_sdk_js/test/lm_fleet.py --out DIR --model char_transformer_tiny@rank=4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

_MiB = 1 << 20
#: The budgets' grid: 1/16 MiB, exact in a float and fine enough that no plan's window falls between two
#: steps (a window can be narrow: the adapters plan of the ONNX Runtime device at 104.007-104.32 MiB, the
#: whole model from there on; a budget rounded up to a whole MiB was planned the whole model).
_STEP = _MiB // 16
#: Device id -> (runtime, the plan its budget buys), in the order the roles are dealt.
DEVICES = {"py-torch": ("torch", "strong"), "py-ort": ("onnxruntime", "adapters"),
           "node-1": ("onnxruntime-node", "strong"), "tab-1": ("onnxruntime-web", "adapters")}


def main() -> None:
    from edge_sdk.data.shakespeare import load_roles
    from edge_sdk.data.sources import TextSource, vocabulary
    from edge_sdk.models import build_model
    from emulator.localfleet import min_budget_for_split
    from profiles.accounting import measure_model
    from exporters.train_export import TrainGraphCache
    from profiles.planner import PlanError, plan_split

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="char_transformer_tiny@rank=4")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--chars", type=int, default=4000)
    args = ap.parse_args()
    roles, _ = load_roles(args.data_root)
    roles = sorted((r for r in roles if len(r.text) >= args.chars), key=lambda r: r.device_id)
    model = build_model(args.model, seed=0)
    cost = measure_model(model)
    graphs_cache = TrainGraphCache(args.out / "store" / "train_graphs")
    out = {}
    graphs = range(len(cost))
    for i, (device, (runtime, wanted)) in enumerate(DEVICES.items()):
        path = args.out / f"{device}.txt"
        path.write_text(roles[3 * i].text[: args.chars], encoding="utf-8")
        samples = len(TextSource(path, vocabulary("tinyshakespeare")))
        least = min_budget_for_split(cost, len(cost) - 1, 32, samples, backend=runtime, graph_splits=graphs)
        budget = -(-least // _STEP) * _STEP  # on the grid the devices are given their budgets in
        while True:  # up from the least budget that trains anything, to the first planned as wanted
            try:
                plan = plan_split(cost, budget, 32, local_samples=samples, backends=(runtime,), graph_splits=graphs)
                if (plan.adapters if wanted == "adapters" else plan.role == wanted):
                    break
            except PlanError:
                pass
            budget += _STEP
        out[device] = {"runtime": runtime, "text": str(path), "samples": samples, "budget_mib": budget / _MiB,
                       "role": plan.role, "split": plan.split, "adapters": plan.adapters}
        if runtime != "torch":
            graphs_cache.get_or_export(model, plan.split, plan.adapters)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
