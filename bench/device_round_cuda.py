"""What one emulated device's round of ResNet20 costs on a GPU against a CPU thread: the figure that
sizes the paper-scale CIFAR-10 run (128 devices a round) once the device trainer runs on CUDA.

A device round here is what a strong device does: load the round's state, 10 local steps of SGD
with momentum on a batch of 32, and the deltas back on the host. On the GPU, 128 such rounds run one
after another in this process (what one lightweight worker would do), after 3 to warm up; on the
CPU, one round on one thread. Plain torch on random data: the model and the step, not the project's
trainer (which does not run on CUDA yet).

Usage: ``python bench/device_round_cuda.py`` (on a machine where torch sees a GPU; bench/gpu_check.sh
runs it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Case, Context  # noqa: E402
from edge_sdk.models import build_model  # noqa: E402

DEVICES, STEPS, BATCH = 128, 10, 32


def device_round(model: torch.nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One device's round: the state in, STEPS local steps, the deltas out on the host."""
    model.load_state_dict(state)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {k: (v - state[k]).cpu() for k, v in model.state_dict().items()}


def timed(device: torch.device, rounds: int, warm: int) -> float:
    """Seconds for ``rounds`` device rounds on ``device`` after ``warm`` untimed ones."""
    model = build_model("resnet20", seed=0).to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(BATCH, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (BATCH,), device=device)
    for _ in range(warm):
        device_round(model, state, x, y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(rounds):
        device_round(model, state, x, y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def run(ctx: Context) -> dict:
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device")
    gpu = timed(torch.device("cuda"), DEVICES, warm=3)
    torch.set_num_threads(1)
    cpu = timed(torch.device("cpu"), 1, warm=0)
    name = torch.cuda.get_device_name(0)
    print(f"GPU ({name}): {DEVICES} device rounds one after another {gpu:.2f} s, "
          f"{1000 * gpu / DEVICES:.1f} ms each; CPU, one thread: one device round {cpu:.2f} s")
    runs = [{"lane": "cuda", "device": name, "device_rounds": DEVICES, "seconds": gpu, "per_round_s": gpu / DEVICES},
            {"lane": "cpu", "device": "one CPU thread", "device_rounds": 1, "seconds": cpu, "per_round_s": cpu}]
    return ctx.write(runs, {"model": "resnet20", "steps": STEPS, "batch": BATCH,
                            "cpu_over_gpu_per_round": cpu / (gpu / DEVICES)})


CASE = Case("device_round_cuda", __doc__, run)


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
