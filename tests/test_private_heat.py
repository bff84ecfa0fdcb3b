"""Private row heat on the wire (FedSubAvg, hot-and-cold appendix F): the hello's extension fields
``fedsubavg.row_bits`` and ``fedsubavg.row_epsilon`` survive the codec, bad values are refused
(by the codec, or at hello by FedSubAvg's declared parsers), and a real server with real devices
over websockets on 127.0.0.1 trains FedSubAvg from randomized-response heat without ever holding a
device's true rows.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from edge_sdk.client import DeviceClient, DeviceSettings, declared_rows
from edge_sdk.data import load_dataset, partition
from edge_sdk.privacy import PrivateHeat
from edge_sdk.protocol import ErrorCode, Hello, Limits, ProtocolError, decode, encode
from orchestrator.config import ServerConfig
from orchestrator.server import Orchestrator
from orchestrator.server.admission import parse_hello_ext
from orchestrator.strategies.base import HelloContext
from orchestrator.strategies.fedsubavg import ROW_BITS, ROW_EPSILON, FedSubAvg

HELLO = Hello("d", "", 0, 0, [], 5, rows={"0": [1, 2]},
              ext={ROW_BITS: {"0": b"\x0f\xf0", "1": b"\x01"}, ROW_EPSILON: 1.5})
TABLES = {"0": "blocks.embeddings.user.weight", "1": "blocks.embeddings.item.weight"}
DEVICES = 3


class Recording(FedSubAvg):
    """FedSubAvg that keeps what the server showed it of each device."""

    def configure(self, ctx):
        self.seen = dict(ctx.devices)
        return super().configure(ctx)


def _ext(**changes):
    return dataclasses.replace(HELLO, ext={**HELLO.ext, **changes})


def test_row_bits_round_trip():
    assert decode(encode(HELLO)) == HELLO
    assert decode(encode(_ext(**{ROW_BITS: {"0": bytearray(b"\x01")}}))).ext[ROW_BITS] == {"0": b"\x01"}
    plain = Hello("d", "", 0, 0, [], 5)
    assert decode(encode(plain)).ext == {}


@pytest.mark.parametrize("bad", [
    {ROW_EPSILON: float("inf")},
    {"row_bits": {"0": b"\x01"}},  # not namespace.name
    {ROW_BITS: {"0": {1, 2}}},  # no msgpack value
])
def test_bad_row_bits_are_refused_by_the_codec(bad):
    with pytest.raises(ProtocolError):
        encode(_ext(**bad))


CONTEXT = HelloContext(columns={"0": TABLES["0"]}, shapes={TABLES["0"]: (16, 4)})


@pytest.mark.parametrize("bad", [
    {ROW_BITS: {"0": b"\x01"}},  # 16 rows take 2 bytes
    {ROW_BITS: {"0": b""}},
    {ROW_BITS: {"0": "not bytes"}},
    {ROW_BITS: {"0": [1, 2]}},
    {ROW_BITS: {"7": b"\x01\x02"}},  # no such sparse input
    {ROW_BITS: {"0": b"\x01\x02"}, ROW_EPSILON: 0.0},  # bits without an epsilon cannot be debiased
    {ROW_BITS: {"0": b"\x01\x02"}, ROW_EPSILON: -1.0},
    {ROW_BITS: {"0": b"\x01\x02"}, ROW_EPSILON: True},
])
def test_bad_row_bits_are_refused_at_hello(bad):
    hello = dataclasses.replace(HELLO, ext={ROW_EPSILON: 1.5, **bad})
    with pytest.raises(ProtocolError) as info:
        parse_hello_ext(hello, FedSubAvg(), CONTEXT)
    assert info.value.code == ErrorCode.MALFORMED
    alone = dataclasses.replace(HELLO, ext={ROW_BITS: {"0": b"\x01\x02"}})  # the epsilon is required with the bits
    with pytest.raises(ProtocolError, match=ROW_EPSILON):
        parse_hello_ext(alone, FedSubAvg(), CONTEXT)
    good = parse_hello_ext(dataclasses.replace(HELLO, ext={ROW_BITS: {"0": b"\x01\x02"}, ROW_EPSILON: 2}),
                           FedSubAvg(), CONTEXT)
    assert good == {ROW_BITS: {TABLES["0"]: b"\x01\x02"}, ROW_EPSILON: 2.0}


def test_row_bits_are_bounded_by_the_limits():
    limits = Limits(max_frame_bytes=1024, max_items=4)
    with pytest.raises(ProtocolError) as info:
        decode(encode(_ext(**{ROW_BITS: {"0": b"x" * 2000}})), limits)
    assert info.value.code == ErrorCode.TOO_LARGE


async def _run(tmp_path) -> tuple[Orchestrator, FedSubAvg, list[dict[str, np.ndarray]], list]:
    config = ServerConfig(model="recommender", rounds=1, min_devices=DEVICES, local_steps=3, batch_size=8,
                          lr=0.05, store_dir=tmp_path / "store", eval_data="synthetic_ratings", deadline_s=120)
    strategy = Recording(weighting="uniform")  # heat in devices (line 9 as written)
    orch = Orchestrator(config, strategy=strategy)
    initial = {k: v.copy() for k, v in orch.global_state.items()}
    ready = asyncio.Event()
    server = asyncio.create_task(orch.run(ready=ready))
    await ready.wait()
    data = load_dataset("synthetic_ratings", split="train")
    shards = partition(data.y, DEVICES, "iid", seed=0)
    sizes = {c: orch.global_state[e].shape[0] for c, e in TABLES.items()}
    clients, truths = [], []
    for i, idx in enumerate(shards):
        truths.append({TABLES[c]: np.asarray(v) for c, v in declared_rows(data.x[idx]).items()})
        cfg = DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=f"dev-{i}", budget_bytes=4 << 30,
                           private_heat=PrivateHeat(2.0, sizes, decoy_rate=0.05))
        clients.append(DeviceClient(cfg, data.x[idx], data.y[idx]))
    await asyncio.wait_for(asyncio.gather(server, *(c.run() for c in clients)), timeout=240)
    return orch, strategy, truths, [initial]


def test_a_round_with_private_heat_never_holds_the_true_rows(tmp_path):
    orch, strategy, truths, (initial,) = asyncio.run(_run(tmp_path))
    assert strategy.heat is not None
    for i, truth in enumerate(truths):
        held = strategy.seen[f"dev-{i}"]
        for entry, rows in truth.items():
            table = strategy.heat[entry]
            contribution = table._devices[f"dev-{i}"]
            assert contribution.rows is None and contribution.bits is not None  # bits, not rows
            # The download set the server saw is the true rows padded with decoys: a strict superset.
            assert set(rows.tolist()) < set(held.rows[entry].tolist())
            assert held.ext[ROW_EPSILON] == 2.0 and len(held.ext[ROW_BITS][entry]) == (table.num_rows + 7) // 8
    # The heat is the clipped randomized-response estimate, and training moved some rows.
    for entry in TABLES.values():
        heat = strategy.heat[entry].heat()
        assert heat.min() >= 1 and heat.max() <= DEVICES
        assert np.any(orch.global_state[entry] != initial[entry])


async def _run_cli_device(tmp_path, *extra: str) -> tuple[Recording, int, str]:
    import subprocess
    import sys
    from pathlib import Path

    config = ServerConfig(model="recommender", rounds=1, min_devices=1, local_steps=2, batch_size=8,
                          store_dir=tmp_path / "store", eval_data="synthetic_ratings", deadline_s=120)
    strategy = Recording()
    orch = Orchestrator(config, strategy=strategy)
    ready = asyncio.Event()
    server = asyncio.create_task(orch.run(ready=ready))
    await ready.wait()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "edge_sdk", "--server", f"ws://127.0.0.1:{orch.port}", "--id", "cli-0",
        "--budget", "4GiB", "--data", "synthetic_ratings", "--partition", "natural", "--num-clients", "40",
        "--private-heat", "1.5", "--once", *extra, cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    await asyncio.wait_for(server, timeout=120)
    _, err = await proc.communicate()
    return strategy, proc.returncode, err.decode()


def test_the_device_command_line_reports_private_heat(tmp_path):
    strategy, code, err = asyncio.run(_run_cli_device(tmp_path))
    assert code == 0, err[-2000:]
    data = load_dataset("synthetic_ratings", split="train")
    truth = declared_rows(data.x[partition(data.groups, 40, "natural", seed=0)[0]])
    info = strategy.seen["cli-0"]
    assert info.ext[ROW_EPSILON] == 1.5
    for column, entry in TABLES.items():
        contribution = strategy.heat[entry]._devices["cli-0"]
        assert contribution.rows is None and contribution.bits is not None  # bits, never the true rows
        assert len(info.ext[ROW_BITS][entry]) == (strategy.heat[entry].num_rows + 7) // 8
        assert set(truth[column]) <= set(info.rows[entry].tolist())  # downloads cover its data


def test_private_heat_options_are_checked():
    import subprocess
    import sys

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "edge_sdk", "--id", "d", "--budget", "1GiB", *argv],
                              capture_output=True, text=True, timeout=60)

    bad = run("--data", "digits", "--private-heat", "1")
    assert bad.returncode == 2 and "--table-rows" in bad.stderr
    bad = run("--data", "synthetic_ratings", "--private-heat", "0")
    assert bad.returncode == 2 and "epsilon" in bad.stderr
    bad = run("--data", "synthetic_ratings", "--private-heat", "1", "--table-rows", "x=3")
    assert bad.returncode == 2 and "COLUMN=ROWS" in bad.stderr
