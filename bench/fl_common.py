"""The workload of ``bench/vs_flower.py`` in plain torch, shared by its plain loop and its Flower apps.

Imports only numpy, torch and the project's model zoo (``edge_sdk.models``, which needs nothing
else), so Flower's own virtual environment can import it with the repository on ``sys.path``
without installing edgetrain. Every lane builds ``mnist_cnn`` with the same seed (the same initial
weights as the orchestrator's), trains on the same shards (written once by ``vs_flower.py`` with
the devices' own partition code) and draws its sample of devices per round the way the
orchestrator does (``orchestrator.rounds.sample_devices``: numpy's generator seeded with
``[seed, round]``), where the framework lets the bench choose.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

MODEL = "mnist_cnn"


def settings() -> dict:
    """The run's settings, handed to every process of a lane as JSON in ``VS_FLOWER_SETTINGS``."""
    return json.loads(os.environ["VS_FLOWER_SETTINGS"])


def build(seed: int):
    from edge_sdk.models.zoo import build_model

    return build_model(MODEL, seed=seed)


def load_shard(shard_dir: str | Path, client: int) -> tuple[np.ndarray, np.ndarray]:
    base = Path(shard_dir)
    return np.load(base / f"x{client:02d}.npy"), np.load(base / f"y{client:02d}.npy")


def load_test(shard_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    base = Path(shard_dir)
    return np.load(base / "x_test.npy"), np.load(base / "y_test.npy")


def sample_round(num_clients: int, per_round: int, rnd: int, seed: int) -> list[int]:
    """The orchestrator's sample for round ``rnd`` (devices named so that sorting keeps client order)."""
    rng = np.random.default_rng([seed, rnd])
    return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))


def local_seed(seed: int, rnd: int, client: int) -> int:
    return (seed * 1_000_003 + rnd * 10_007 + client) % (1 << 31)


def train_local(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, *, steps: int, batch: int, lr: float,
                momentum: float, seed: int) -> float:
    """``steps`` SGD steps (momentum, no weight decay) on random mini-batches; the mean batch loss.

    What a user of any framework writes in a client's training function: torch's own SGD, one thread.
    """
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    total = 0.0
    for _ in range(steps):
        idx = np.sort(rng.choice(len(x), size=min(batch, len(x)), replace=False))
        xb, yb = torch.from_numpy(np.ascontiguousarray(x[idx])), torch.from_numpy(np.ascontiguousarray(y[idx]))
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        total += float(loss.detach())
    return total / max(steps, 1)


def evaluate(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch: int = 256) -> dict[str, float]:
    """Accuracy and mean cross-entropy on the test split (as the orchestrator's evaluator does)."""
    torch.set_num_threads(1)
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            xb = torch.from_numpy(np.ascontiguousarray(x[i:i + batch]))
            yb = torch.from_numpy(np.ascontiguousarray(y[i:i + batch]))
            out = model(xb)
            loss_sum += float(F.cross_entropy(out, yb)) * len(xb)
            correct += int((out.argmax(dim=1) == yb).sum())
    return {"accuracy": correct / max(len(x), 1), "test_loss": loss_sum / max(len(x), 1)}


def lo_bytes() -> int | None:
    """Bytes sent on the loopback interface of this process's network namespace (``/proc/self/net/dev``).

    On loopback every byte sent is also received, so this counts each byte on the wire once, TCP/IP
    headers included. In the lane's own namespace (``vs_flower.py`` runs each lane under
    ``unshare --net``) it counts that lane's traffic only."""
    try:
        for line in Path("/proc/self/net/dev").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    except OSError:
        pass
    return None
