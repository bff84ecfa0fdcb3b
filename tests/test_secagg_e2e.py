"""Secure aggregation in a running server: a real orchestrator on 127.0.0.1, the production device
client over real websockets (torch and ONNX Runtime backends), real SQLite, digits_mlp under
EmbracingFL with nested cohorts (strong trains blocks 0-3, moderate and weak the last ones).

The test knows what the server process does not: each device's quantized update (recorded as the
device encodes it) and each upload the server's intake receives. It checks that no upload equals or
correlates with its device's quantized update, that each revealed block is exactly the ring sum of
the cohort's encodings and within the stated quantization error of the plain sum, and the journal.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.secagg.fixedpoint import BlockEncoder, FixedPoint, packed_bytes, unpack_words
from edge_sdk.secagg.round import DeviceRound, weight_of
from emulator.localfleet import role_budgets, start_orchestrator
from orchestrator.aggregation.intake import Intake
from orchestrator.aggregation.secure.round import SecureRound
from orchestrator.config import ServerConfig
from orchestrator.store import Store

# Three strong devices: every block has at least t = 3 trainers (a majority of the cohort of five,
# docs/security.md, "Block thresholds"), so every block is trained securely.
FLEET = {"strong-0": ("strong", "torch"), "strong-1": ("strong", "onnxruntime"),
         "moderate-2": ("moderate", "torch"), "strong-3": ("strong", "onnxruntime"), "weak-4": ("weak", "torch")}


class Recorder:
    """What the test sees and the server does not: devices' encodings; and what the server received."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.plain: dict[tuple[int, str], dict] = {}
        self.received: dict[tuple[int, str], dict] = {}
        self.outcomes: dict[int, tuple[FixedPoint, list]] = {}
        self.rounds: dict[int, SecureRound] = {}
        local = threading.local()  # devices mask in worker threads, several at once: each its own record
        start, rounding = BlockEncoder.__init__, BlockEncoder._round
        mask, fold, finish = DeviceRound.mask, Intake.fold, SecureRound.finish

        def starting(encoder, *args, **kwargs):  # a block's encoding begins: its words come slice by slice
            start(encoder, *args, **kwargs)
            self.plain[local.current]["pieces"].append([])

        def encoding(encoder, y):
            words = rounding(encoder, y)
            self.plain[local.current]["pieces"][-1].append(words.copy())
            return words

        def masking(rnd, blocks, num_samples):
            local.current = (rnd.scope.round, rnd.device_id)
            vectors = [np.concatenate([b] if isinstance(b, np.ndarray) else b).astype(np.float64) for b in blocks]
            record = self.plain[local.current] = {"blocks": vectors, "samples": num_samples, "split": rnd.split,
                                                  "scale": rnd.weight_scale, "pieces": []}
            out = mask(rnd, blocks, num_samples)
            record["words"] = [np.concatenate(pieces) for pieces in record.pop("pieces")]
            return out

        def folding(intake, session, msg, work, tensors, ctx):
            self.received[(ctx.round, session.device_id)] = {k: np.asarray(v).copy() for k, v in tensors.items()}
            return fold(intake, session, msg, work, tensors, ctx)

        def finishing(secure):
            out = finish(secure)
            self.outcomes[secure.scope.round] = (secure.fixed, out)
            self.rounds[secure.scope.round] = secure
            return out

        monkeypatch.setattr(BlockEncoder, "__init__", starting)
        monkeypatch.setattr(BlockEncoder, "_round", encoding)
        monkeypatch.setattr(DeviceRound, "mask", masking)
        monkeypatch.setattr(Intake, "fold", folding)
        monkeypatch.setattr(SecureRound, "finish", finishing)


def _run_fleet(tmp_path: Path, rounds: int, reconnect_retries: int = 0, secure: bool = True,
               **overrides) -> tuple[list[dict], Path]:
    store_dir = tmp_path / "store"
    with Store(store_dir) as store:
        secrets = {d: store.credentials.enroll(d) for d in FLEET}
    config = ServerConfig(model="digits_mlp", rounds=rounds, min_devices=len(FLEET), local_steps=5, lr=0.1,
                          store_dir=store_dir, deadline_s=300, require_credentials=True, secure_aggregation=secure,
                          secure_clip=20.0, eval_every=rounds, **overrides)
    # Planned with the secure round's memory (TrainingMemory.secured); the plain run's roles are the same.
    budgets = {b: role_budgets("digits_mlp", backend=b, secure=True) for b in ("torch", "onnxruntime")}

    async def main() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        devices = []
        for i, (d, (role, backend)) in enumerate(FLEET.items()):
            x, y = load_shard("digits", client=i, num_clients=len(FLEET))
            cfg = DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=d, budget_bytes=budgets[backend][role],
                               backend=backend, secret=secrets[d], reconnect_retries=reconnect_retries)
            devices.append(asyncio.create_task(DeviceClient(cfg, x, y).run()))
        history = await asyncio.wait_for(server, timeout=900)
        await asyncio.gather(*devices, return_exceptions=True)
        return history

    return asyncio.run(main()), store_dir


def _lifted(words: np.ndarray, bits: int) -> np.ndarray:
    w = words.astype(np.int64) & ((1 << bits) - 1)
    return np.where(w >= 2 ** (bits - 1), w - 2**bits, w).astype(np.float64)


@pytest.mark.slow
def test_mixed_fleet_trains_digits_with_secure_aggregation_blind_and_exact(tmp_path: Path, monkeypatch) -> None:
    rec = Recorder(monkeypatch)
    history, store_dir = _run_fleet(tmp_path, rounds=3)
    assert [h["round"] for h in history] == [1, 2, 3]
    assert history[-1]["accuracy"] > 0.6, history[-1]
    splits = {}
    for (r, d), plain in rec.plain.items():
        splits[d] = plain["split"]
        fixed, outcomes = rec.outcomes[r]
        got = rec.received[(r, d)]
        seen = np.concatenate([got[f"secagg.{b}"].view(np.uint32) for b in range(plain["split"], 4)])
        own = np.concatenate(plain["words"])
        assert seen.shape == own.shape and not np.array_equal(seen, own)
        assert np.mean(seen == own) < 1e-3
        corr = np.corrcoef(_lifted(seen, fixed.ring_bits), _lifted(own, fixed.ring_bits))[0, 1]
        assert abs(corr) < 4 / np.sqrt(seen.size), (d, r, corr)
    assert len(set(splits.values())) >= 2, splits  # nested cohorts
    # Weighted by samples: the scale is the largest sample count of the round's devices.
    assert all(p["scale"] == max(q["samples"] for (r, _), q in rec.plain.items() if r == rr)
               for (rr, _), p in rec.plain.items()), {k: (p["scale"], p["samples"]) for k, p in rec.plain.items()}
    for r, (fixed, outcomes) in rec.outcomes.items():
        members = {d: p for (rr, d), p in rec.plain.items() if rr == r}
        for out in outcomes:
            cohort = {d: p for d, p in members.items() if p["split"] <= out.block}
            assert out.values is not None and out.cohort == len(cohort), out.reason
            i = {d: out.block - p["split"] for d, p in cohort.items()}
            total = sum(cohort[d]["words"][i[d]].astype(np.uint64) for d in cohort) % (1 << fixed.ring_bits)
            assert np.array_equal(fixed.decode(total.astype(np.uint32)).values, out.values)  # exact ring sum
            plain = sum(_clipped(p["blocks"][i[d]], fixed.clip) * weight_of(p["samples"], p["scale"])
                        for d, p in cohort.items())
            assert np.max(np.abs(out.values - plain)) <= fixed.error_bound
            assert abs(out.weight - sum(weight_of(p["samples"], p["scale"]) for p in cohort.values())) \
                <= fixed.weight_error_bound
    for h in history:
        assert all(b["revealed"] for b in h["secure"]["blocks"].values()), h["secure"]
    with Store(store_dir) as store:
        accepted = [u for u in store.reports.all() if u.get("accepted")]
    assert len(accepted) == 3 * len(FLEET) and all(u.get("secure") for u in accepted)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_compressed_round_sends_packed_words_and_reveals_their_exact_ring_sum(tmp_path: Path, monkeypatch) -> None:
    """secure_value_bits = 8 on the mixed fleet: every upload is its blocks' words packed at the ring's
    b bits (5 devices: b = 11), and each revealed block is the exact ring sum of the cohort's encodings,
    within n 2^-f of the sum of their clipped, clamped, weighted updates."""
    rec = Recorder(monkeypatch)
    history, _ = _run_fleet(tmp_path, rounds=2, secure_value_bits=8)
    # Above chance (0.1); secure_clip 20 is far above these updates' norms, so B and the step are coarse here.
    assert [h["round"] for h in history] == [1, 2] and history[-1]["accuracy"] > 0.2, history[-1]
    for (r, d), plain in rec.plain.items():
        secure = rec.rounds[r]
        assert secure.compression is not None and secure.fixed.ring_bits == 11
        for i, b in enumerate(range(plain["split"], 4)):
            got = rec.received[(r, d)][f"secagg.{b}"]
            assert got.dtype == np.uint8 and got.size == packed_bytes(secure.sizes[b] + 1, 11)
            assert not np.array_equal(unpack_words(got, secure.sizes[b] + 1, 11), plain["words"][i])
    for r, (_, outcomes) in rec.outcomes.items():
        members = {d: p for (rr, d), p in rec.plain.items() if rr == r}
        for out in outcomes:
            fixed = rec.rounds[r].fixed_for(out.block)
            cohort = {d: p for d, p in members.items() if p["split"] <= out.block}
            i = {d: out.block - p["split"] for d, p in cohort.items()}
            total = sum(cohort[d]["words"][i[d]].astype(np.uint64) for d in cohort) % (1 << fixed.ring_bits)
            assert np.array_equal(fixed.decode(total.astype(np.uint32)).values, out.values)  # exact ring sum
            plain = sum(np.clip(_clipped(p["blocks"][i[d]], fixed.clip), -fixed.bound, fixed.bound)
                        * weight_of(p["samples"], p["scale"]) for d, p in cohort.items())
            assert np.max(np.abs(out.values - plain)) <= fixed.error_bound


def _clipped(x: np.ndarray, clip: float) -> np.ndarray:
    norm = float(np.linalg.norm(x))
    return x * (1.0 if norm <= clip else clip / norm)


class Killed(RuntimeError):
    """The device process is gone (its client task ends; its connection closes)."""


@pytest.mark.slow
def test_dropouts_after_keys_and_after_upload_are_survived_and_a_returning_device_refused(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """Round 1: weak-4's connection drops after it shared its keys (it reconnects at once and is
    refused for the round), moderate-2 is killed after its masked upload (never answers the
    unmasking). The round completes with every block revealed, weak-4's masks removed from its
    shares; round 2 trains with weak-4 back and without moderate-2."""
    from websockets.exceptions import ConnectionClosedError

    from edge_sdk.roundwork import RoundWork

    rec = Recorder(monkeypatch)
    mask, reveal = DeviceRound.mask, RoundWork.reveal

    def dropping(rnd, blocks, num_samples):
        if (rnd.device_id, rnd.scope.round) == ("weak-4", 1):
            raise ConnectionClosedError(None, None)  # the connection drops; the client reconnects
        return mask(rnd, blocks, num_samples)

    async def dying(work, ch, msg):
        if work.device.device_id == "moderate-2":
            raise Killed("moderate-2 killed after its masked upload")
        return await reveal(work, ch, msg)

    monkeypatch.setattr(DeviceRound, "mask", dropping)
    monkeypatch.setattr(RoundWork, "reveal", dying)
    history, store_dir = _run_fleet(tmp_path, rounds=2, reconnect_retries=3)
    assert [h["round"] for h in history] == [1, 2]
    first = history[0]["secure"]
    assert all(b["revealed"] for b in first["blocks"].values()), first
    assert first["recovered"] == ["weak-4"] and first["masked"] == len(FLEET) - 1
    fixed, outcomes = rec.outcomes[1]
    uploaded = {d: p for (r, d), p in rec.plain.items() if r == 1 and (r, d) in rec.received}
    assert "moderate-2" in uploaded and "weak-4" not in uploaded
    for out in outcomes:
        cohort = {d: p for d, p in uploaded.items() if p["split"] <= out.block}
        total = sum(p["words"][out.block - p["split"]].astype(np.uint64) for p in cohort.values())
        assert np.array_equal(fixed.decode((total % (1 << fixed.ring_bits)).astype(np.uint32)).values, out.values)
    assert {d for (r, d) in rec.received if r == 2} == set(FLEET) - {"moderate-2"}
    with Store(store_dir) as store:
        refused = [u for u in store.reports.all(1) if u["device_id"] == "weak-4" and not u.get("accepted")]
    assert refused and "secure round" in refused[-1]["reason"], refused


@pytest.mark.slow
def test_device_processes_survive_one_killed_after_its_masked_upload(tmp_path: Path) -> None:
    """Real device processes (``python -m edge_sdk``, torch and ONNX Runtime) with their credential
    files; one is SIGKILLed as soon as the server folded its round-1 masked upload. Round 1 still
    reveals every block (its self mask rebuilt from its neighbours' shares); round 2 trains without it."""
    import os
    import signal
    import sys

    from emulator.localfleet import device_env

    fleet = {d: FLEET[d] for d in ("strong-0", "strong-1", "moderate-2", "strong-3")}  # t = 3 of 4
    victim = "moderate-2"
    store_dir = tmp_path / "store"
    with Store(store_dir) as store:
        secrets = {d: store.credentials.enroll(d) for d in fleet}
    for d, s in secrets.items():
        (tmp_path / f"{d}.secret").write_text(s + "\n")
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=len(fleet), local_steps=5, lr=0.1,
                          store_dir=store_dir, deadline_s=300, require_credentials=True, secure_aggregation=True,
                          secure_clip=20.0, eval_every=2)
    # Planned with the secure round's memory (TrainingMemory.secured); the plain run's roles are the same.
    budgets = {b: role_budgets("digits_mlp", backend=b, secure=True) for b in ("torch", "onnxruntime")}
    procs: dict[str, asyncio.subprocess.Process] = {}

    def on_event(kind: str, data: dict) -> None:
        if kind == "update" and data.get("device") == victim and data.get("round") == 1 and victim in procs:
            os.kill(procs[victim].pid, signal.SIGKILL)

    async def main() -> list[dict]:
        orch, server = await start_orchestrator(config, on_event)
        for i, (d, (role, backend)) in enumerate(fleet.items()):
            procs[d] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "edge_sdk", "--server", f"ws://127.0.0.1:{orch.port}", "--id", d,
                "--budget", str(budgets[backend][role]), "--backend", backend, "--data", "digits", "--client", str(i),
                "--num-clients", str(len(fleet)), "--secret-file", str(tmp_path / f"{d}.secret"), "--once",
                "--reconnect-retries", "3", env=device_env(), stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
        try:
            return await asyncio.wait_for(server, timeout=900)
        finally:
            for proc in procs.values():
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()

    history = asyncio.run(main())
    assert [h["round"] for h in history] == [1, 2]
    first, second = history[0]["secure"], history[1]["secure"]
    assert first["masked"] == 4 and all(b["revealed"] for b in first["blocks"].values()), first
    assert second["masked"] == 3 and all(b["revealed"] for b in second["blocks"].values()), second
    assert history[-1]["accuracy"] > 0.3, history[-1]  # 10 classes: chance is 0.1; 2 rounds


@pytest.mark.slow
@pytest.mark.heavy
def test_secure_and_plain_rounds_reach_the_same_accuracy(tmp_path: Path) -> None:
    """The same fleet, seeds and rule (EmbracingFL's sample-weighted mean per block, no norm bound,
    no direction trust, no weight cap, a clip no update reaches) with and without secure aggregation: the secure
    model's accuracy is the plain one's, up to the quantisation and the devices' own nondeterminism. In the
    heavy tier (two fleets, about 100 s on 2 cores): CI holds the secure fleet's sums exact against the
    devices' quantised updates (test_mixed_fleet_trains_digits_with_secure_aggregation_blind_and_exact)."""
    plain, _ = _run_fleet(tmp_path / "plain", rounds=3, secure=False, norm_bound=0.0, direction_trust=False,
                          strategy_options={"max_weight_share": 1.0})
    secure, _ = _run_fleet(tmp_path / "secure", rounds=3)
    assert abs(secure[-1]["accuracy"] - plain[-1]["accuracy"]) < 0.03, (secure[-1]["accuracy"], plain[-1]["accuracy"])
