"""The SQLite journal and checkpoints: restart from the last completed round, detect damage,
survive SIGKILL. Real files, real SQLite, real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from emulator.runner import completed_rounds
from orchestrator.store import CheckpointCorrupted, Store, StoreError, checkpoint_name

REPO = Path(__file__).resolve().parents[1]


def model_state(round: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(round)
    return {
        "blocks.fc1.weight": rng.normal(size=(16, 8)).astype(np.float32),
        "blocks.fc1.bias": rng.normal(size=16).astype(np.float32),
        "blocks.bn.num_batches_tracked": np.array(round * 10, np.int64),
        "blocks.head.weight": rng.normal(size=(2, 16)).astype(np.float32),
    }


def run_rounds(store: Store, rounds) -> None:
    for r in rounds:
        store.rounds.begin(r, [f"d{r}", "d0"])
        store.reports.record(r, "d0", {"role": "strong", "trained": (0, 3), "samples": 10, "accepted": True})
        store.reports.record(
            r, f"d{r}", {"role": "weak", "trained": [2, 3], "samples": np.int64(5), "accepted": False, "reason": "NaN"}
        )
        store.rounds.complete(r, model_state(r), {"accuracy": 0.5 + r / 100, "loss": np.float32(1.5)})


def assert_states_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
        np.testing.assert_array_equal(got[key], want[key])


def test_restart_returns_the_last_completed_round(tmp_path):
    store = Store(tmp_path)
    assert store.checkpoints.last() is None
    run_rounds(store, [1, 2, 3])
    store.rounds.begin(4, ["d0"])  # begun, never completed: not a resume point
    store.close()

    store = Store(tmp_path)
    round, state = store.checkpoints.last()
    assert round == 3
    assert_states_equal(state, model_state(3))
    assert (tmp_path / "journal.sqlite3").is_file()
    # The file header's read and write versions are 2 in WAL mode (sqlite.org/fileformat.html, 1.3.3).
    assert (tmp_path / "journal.sqlite3").read_bytes()[18:20] == b"\x02\x02"
    rounds = store.rounds.all()
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert [r["complete"] for r in rounds] == [True, True, True, False]
    assert rounds[2]["metrics"] == {"accuracy": 0.53, "loss": 1.5}
    assert rounds[2]["selected"] == ["d3", "d0"] and rounds[2]["reported"] == 2
    assert rounds[3]["finished"] is None and rounds[3]["metrics"] is None
    # the interrupted round is begun again cleanly and completes
    store.rounds.begin(4, ["d1"])
    store.rounds.complete(4, model_state(4), {})
    assert store.checkpoints.last()[0] == 4
    store.close()


def test_updates_devices_and_meta_are_journaled(tmp_path):
    with Store(tmp_path) as store:
        store.devices.record("phone-1", {"ram_mib": 4096, "cores": 8}, {"role": "strong", "split": 0})
        first_seen = store.devices.all()[0]["last_seen"]
        time.sleep(0.01)
        store.devices.record("phone-1", {"ram_mib": 4096, "cores": 8}, {"role": "moderate", "split": 2})
        store.devices.record("pi-zero", {"ram_mib": 512}, {"role": "weak", "split": 3})
        run_rounds(store, [1, 2])
        store.meta.record("model", "resnet20")
        store.meta.record("config", {"rounds": 100, "strategy": "embracingfl"})
    with Store(tmp_path) as store:
        devices = {d["device_id"]: d for d in store.devices.all()}
        assert devices["phone-1"]["plan"] == {"role": "moderate", "split": 2}
        assert devices["phone-1"]["last_seen"] > first_seen >= devices["phone-1"]["first_seen"]
        assert devices["pi-zero"]["profile"] == {"ram_mib": 512}
        updates = store.reports.all(2)
        assert [(u["device_id"], u["accepted"]) for u in updates] == [("d0", True), ("d2", False)]
        assert updates[1]["reason"] == "NaN" and updates[1]["samples"] == 5 and updates[1]["trained"] == [2, 3]
        assert len(store.reports.all()) == 4
        assert store.meta.get("model") == "resnet20"
        assert store.meta.get("config") == {"rounds": 100, "strategy": "embracingfl"}
        assert store.meta.get("absent", "fallback") == "fallback"


def test_a_read_only_store_watches_a_run_that_is_still_going(tmp_path):
    """What the emulator's resume, the benchmarks and the JavaScript tests read a run through: the
    store's own read methods on a read-only connection, while the writer keeps writing."""
    assert completed_rounds(tmp_path / "none") == 0 and not (tmp_path / "none").exists()
    with pytest.raises(FileNotFoundError, match="holds no journal"):
        Store.open_readonly(tmp_path / "none")
    with Store(tmp_path / "run") as writer:
        writer.devices.record("d0", {"runtimes": ["torch"]}, {"role": "strong", "split": 0})
        run_rounds(writer, [1, 2])
        with Store.open_readonly(tmp_path / "run") as reader:
            assert reader.rounds.completed() == 2 == completed_rounds(tmp_path / "run")
            writer.rounds.begin(3, ["d0"])  # begun, not complete: not counted
            writer.reports.record(3, "d0", {"accepted": True, "samples": 3})
            assert reader.rounds.completed() == 2
            assert [r["complete"] for r in reader.rounds.all()] == [True, True, False]
            assert [(u["device_id"], u["accepted"]) for u in reader.reports.all(3)] == [("d0", True)]
            writer.rounds.complete(3, model_state(3), {"accuracy": 0.9})
            assert reader.rounds.completed() == 3 and reader.rounds.all()[2]["metrics"] == {"accuracy": 0.9}
            assert reader.devices.all()[0]["plan"] == {"role": "strong", "split": 0}
            assert reader.checkpoints.last()[0] == 3
            with pytest.raises(Exception, match="readonly"):
                reader.meta.record("model", "tiny")
        assert writer.meta.get("model") is None


def test_journal_refuses_out_of_order_calls(tmp_path):
    with Store(tmp_path) as store:
        with pytest.raises(StoreError, match="was not begun"):
            store.rounds.complete(1, model_state(1), {})
        with pytest.raises(StoreError, match="was not begun"):
            store.reports.record(1, "d0", {})
        run_rounds(store, [1])
        with pytest.raises(StoreError, match="already complete"):
            store.rounds.begin(1, [])
        with pytest.raises(StoreError, match="already complete"):
            store.reports.record(1, "late", {"accepted": True})
        with pytest.raises(ValueError, match="round must be a non-negative integer"):
            store.rounds.begin(-1, [])
        with pytest.raises(TypeError, match="cannot store object"):
            store.meta.record("bad", object())


def test_only_the_last_checkpoints_are_kept(tmp_path):
    with Store(tmp_path, keep=2) as store:
        run_rounds(store, [1, 2, 3, 4])
        files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
        assert files == [checkpoint_name(3), checkpoint_name(4)]
        assert len(store.rounds.all()) == 4  # the journal keeps every round


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_checkpoint_is_detected(tmp_path, damage):
    with Store(tmp_path) as store:
        run_rounds(store, [1, 2, 3])
    path = tmp_path / "checkpoints" / checkpoint_name(3)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
    else:
        path.unlink()
    with Store(tmp_path) as store:
        with pytest.raises(CheckpointCorrupted, match=r"round 3 .*intact checkpoints remain for rounds \[1, 2\]"):
            store.checkpoints.last()


def test_a_checkpoint_written_but_not_journaled_is_not_a_completed_round(tmp_path):
    """The crash window between the checkpoint write and the journal commit, made real: a child
    process writes round 3's checkpoint with the store's own writer and is SIGKILLed before the
    journal row commits."""
    with Store(tmp_path) as store:
        run_rounds(store, [1, 2])
        store.rounds.begin(3, ["d0"])
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from orchestrator.store import checkpoint_name, write_checkpoint
        from tests.test_store import model_state
        write_checkpoint(Path({str(tmp_path)!r}) / "checkpoints" / checkpoint_name(3), model_state(3))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "checkpoints" / checkpoint_name(3)).is_file()
    with Store(tmp_path) as store:
        round, state = store.checkpoints.last()
        assert round == 2
        assert_states_equal(state, model_state(2))
        store.rounds.begin(3, ["d0"])
        store.rounds.complete(3, model_state(3), {})
        assert store.checkpoints.last()[0] == 3


WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, {repo!r})
import numpy as np
from orchestrator.store import Store

store = Store(Path({directory!r}), keep=2)
last = store.checkpoints.last()
start = 1 if last is None else last[0] + 1
big = np.zeros((512, 1024), np.float32)  # 2 MiB, so that kills land inside checkpoint writes
for r in range(start, start + 10_000):
    store.rounds.begin(r, ["a", "b"])
    store.reports.record(r, "a", {{"accepted": True, "samples": r}})
    store.rounds.complete(r, {{"w": big + r, "n": np.array(r, np.int64)}}, {{"round": r}})
    print(r, flush=True)
"""


@pytest.mark.parametrize("after", [1, 3])
def test_sigkill_while_writing_rounds_loses_no_completed_round(tmp_path, after):
    script = WRITER.format(repo=str(REPO), directory=str(tmp_path))
    reported = 0
    for kill in range(3):  # kill, restart from the journal, kill again
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            seen = 0
            while seen < after:
                line = proc.stdout.readline()
                assert line, f"writer exited early with {proc.wait()}"
                reported = int(line)
                seen += 1
            time.sleep(0.005 * kill)  # land at different points of a round
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
            for line in proc.stdout.read().split():  # what it printed before dying
                reported = int(line)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        with Store(tmp_path, keep=2) as store:
            round, state = store.checkpoints.last()
            # every round the writer reported is complete; one more may have completed unreported
            assert reported <= round <= reported + 1
            assert int(state["n"]) == round
            np.testing.assert_array_equal(state["w"], np.full((512, 1024), round, np.float32))
            rounds = store.rounds.all()
            complete = [r["round"] for r in rounds if r["complete"]]
            assert complete == list(range(1, round + 1))
            assert all(r["metrics"] == {"round": r["round"]} for r in rounds if r["complete"])
            reported = round
