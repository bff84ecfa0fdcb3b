#!/usr/bin/env bash
# The checks that need a GPU, as one short script for a GPU machine without internet access:
#
#   1. tests/test_cuda.py: the server's evaluation on CUDA scores what the CPU scores (they are
#      skipped, one line each, where torch sees no GPU); bench/device_round_cuda.py: one device's
#      round of ResNet20 on the GPU against a CPU thread;
#   2. EmbracingFL's CIFAR-10 table at the paper's scale (bench/embracing.py --paper-scale: 128
#      clients over all 50,000 training images, every client in every round, tau = 10, batch 32),
#      cases 1 and 6, both methods, for $ROUNDS rounds (default 6: a timing run; 1000 is the paper's),
#      the server's evaluation on the GPU. It prints the paper's table with the measured column beside
#      it and each round's wall time.
#
# What the machine needs: Python 3.10+ with torch (any CUDA build), numpy, onnx, onnxscript,
# onnxruntime, msgpack, psutil, typer, rich, pillow, matplotlib, pytest; and websockets, the one
# dependency GPU images tend to lack. Wheels of what is missing go in $WHEELS (default runs/gpu/whl:
# README.md, "On a GPU machine", says how to fetch them), the CIFAR-10 archive under $EDGETRAIN_DATA
# (default runs/gpu/data/cifar10_jpg/cifar10_jpg.tar.gz). Results go to $RESULTS (default
# runs/gpu/out). About 6 minutes on one H200 machine with 16 cores at the default $ROUNDS (340 s, 2026-11-27).
set -u
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-runs/gpu/whl}
RESULTS=${RESULTS:-runs/gpu/out}
ROUNDS=${ROUNDS:-6}
export EDGETRAIN_DATA=$(realpath "${EDGETRAIN_DATA:-runs/gpu/data}")
export PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/edgetrain-site \
        "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/edgetrain-site:$PWD
else
    export PYTHONPATH=$PWD
fi
$PY - <<'EOF' || exit 1
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import orchestrator.server.orchestrator, edge_sdk.client  # noqa: F401,E401  (every dependency of a run is there)
EOF
echo "== decoding CIFAR-10 once (every worker then reads the cache)"
$PY -c "from edge_sdk.data import load_dataset; [load_dataset('cifar10', split=s) for s in ('train', 'test')]" || exit 1
echo "== tests/test_cuda.py"
$PY -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$RESULTS/test_cuda.log"
echo "== bench/device_round_cuda.py"
$PY bench/device_round_cuda.py --out "$RESULTS/device_round_cuda.json" 2>&1 | tee "$RESULTS/device_round_cuda.log"
echo "== bench/embracing.py --paper-scale --rounds $ROUNDS"
$PY bench/embracing.py --paper-scale --device "${DEVICE:-cuda}" --cases 1,6 --seeds 0 --rounds "$ROUNDS" \
    --eval-every "${EVAL_EVERY:-3}" --workdir /tmp/edgetrain-paper-runs --out "$RESULTS/embracing-paper.json" \
    2>&1 | tee "$RESULTS/embracing-paper.log"
$PY - "$RESULTS/embracing-paper.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:  # bench/harness/results.py's schema: one record per run
    walls = r["round_wall_s"]
    print(f"c{r['case']}/{r['method']} seed {r['seed']}: {len(walls)} rounds, wall per round "
          f"{sum(walls) / len(walls):.1f} s (first {walls[0]:.1f} s), run {r['wall_s']:.0f} s")
EOF
