"""Peak memory against the declared budget, per runtime and split (docs/js-device.md, "Memory").

Each row is one device against a real orchestrator for ``--rounds`` rounds (10 local steps each):
the Python device and a Node device (onnxruntime-node) under a hard memory cap equal to their budget
(a cgroup memory controller, emulator.capping: over the budget is a kill), their peak
the process's resident high-water mark, and a headless Chromium tab (onnxruntime-web), its peak the
renderer's, and a tab training on its GPU (onnxruntime-web's WebGPU build; SwiftShader here), its peak
the renderer's with the GPU process's peak reported beside it (``gpu``: a page can neither see nor bound
it). The role and split are what the server planned for the budget; ``rounds`` and ``accepted`` come
from its journal. The work is edge_sdk_js/test/budgets.mjs, the budgets test's.
``--trace`` also prints where each tab's memory went, per round and phase (session created, run,
released; sampled every 200 ms): the renderer's resident memory and peak, the page's WebAssembly
memory and its JavaScript heap.

    PYTHONPATH=. python bench/js_budgets.py [--rounds 5] [--rows node:digits_mlp:185,tab:digits_mlp:400] [--trace]

Needs `npm ci` and `npm run build` in edge_sdk_js/ first, root (for the cap) and Debian's chromium (tabs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, parse_list  # noqa: E402

JS = ROOT / "edge_sdk_js"
MiB = 1 << 20

#: kind:model:budget MiB. The Node and Python devices at a weak and a strong budget (digits_mlp and a
#: CNN), the tabs (on WebAssembly, and on the GPU) at a weak and a moderate one.
ROWS = ("python:digits_mlp:185", "node:digits_mlp:185", "node:digits_mlp:400", "node:mnist_cnn:185",
        "tab:digits_mlp:400", "tab:digits_mlp:580", "gputab:digits_mlp:530", "gputab:digits_mlp:710")
RUNTIME = {"python": "python (edge_sdk)", "node": "onnxruntime-node", "tab": "onnxruntime-web (Chromium tab)",
           "gputab": "onnxruntime-webgpu (tab, SwiftShader)"}


def measure(row: str, rounds: int, trace: bool = False) -> dict:
    kind, model, budget = row.split(":")
    env = {**os.environ, "EDGETRAIN_PYTHON": sys.executable}
    argv = ["node", str(JS / "bench" / "budgets.mjs"), kind, model, budget, str(rounds), *(["--trace"] if trace else [])]
    out = subprocess.run(argv, cwd=JS, env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"row": row, "error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"row": row, **r}


def _print(rows: list[dict]) -> None:
    print(f"{'runtime':37} {'model':11} {'budget':>7} {'role':9} {'split':>5} {'rounds':>6} {'peak':>8} {'peak/budget':>11} "
          f"{'gpu':>8}")
    for r in rows:
        if "error" in r or "skipped" in r or r.get("role") is None:
            print(f"{r['row']:37} {r.get('error') or r.get('skipped') or 'not planned: ' + str(r.get('cap'))}")
            continue
        gpu = f"{r['gpuPeak'] / MiB:7.1f}M" if r.get("gpuPeak") else "-"
        print(f"{RUNTIME[r['kind']]:37} {r['model']:11} {r['budget'] / MiB:6.0f}M {r['role'] or '-':9} {r['split']!s:>5} "
              f"{r['accepted']:>3}/{r['finished']:<2} {r['peak'] / MiB:7.1f}M {r['peak'] / r['budget']:11.2f} {gpu:>8}")
    for r in (r for r in rows if r.get("phases")):
        print(f"\n{r['row']}: where the tab's memory went (MiB, the largest of each reading)")
        print(f"{'round':>5} {'phase':16} {'rss':>7} {'peak':>7} {'wasm':>7} {'js heap':>7} {'gpu':>7}")
        for p in r["phases"]:
            print(f"{p['round']:>5} {p['phase']:16} {p['rss']:7.1f} {p['peak']:7.1f} {p['wasm']:7.1f} {p['js']:7.1f} "
                  f"{p.get('gpu', 0):7.1f}")


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", default=",".join(ROWS),
                    help="kind:model:budget_mib, comma-separated (kind: python, node, tab, gputab)")
    ap.add_argument("--trace", action="store_true", help="also where each tab's memory went, per round and phase")


def run(ctx: Context) -> dict:
    args = ctx.args
    rows = [measure(row, args.rounds, args.trace) for row in parse_list(args.rows)]
    _print(rows)
    return ctx.write(rows, {"rounds": args.rounds})


CASE = Case("js_budgets", __doc__, run, arguments=arguments, quick={"rounds": 1, "rows": "python:digits_mlp:185"})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
