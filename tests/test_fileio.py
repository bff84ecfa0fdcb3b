"""edge_sdk.fileio.atomic_write: readers see the old file or the whole new one, and nothing is left behind."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import pytest

from edge_sdk.fileio import TEMP_GLOB, atomic_write, remove_leftovers


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("durable", [True, False])
def test_content_is_replaced_whole(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "state.bin"
    target.write_bytes(b"old content that is longer than the new one")
    atomic_write(target, b"new", durable=durable)
    assert target.read_bytes() == b"new"  # not the new bytes over the tail of the old ones
    atomic_write(target, memoryview(b"again"), durable=durable)
    assert target.read_bytes() == b"again"
    assert _entries(tmp_path) == ["state.bin"]


def test_a_writer_streams_into_the_file(tmp_path: Path) -> None:
    target = tmp_path / "new.bin"

    def write(f: BinaryIO) -> None:
        for i in range(3):
            f.write(bytes([i]) * 4)

    atomic_write(target, writer=write)
    assert target.read_bytes() == b"\0" * 4 + b"\1" * 4 + b"\2" * 4
    assert _entries(tmp_path) == ["new.bin"]


def test_a_failing_writer_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.npz"
    target.write_bytes(b"the old checkpoint")
    seen: list[str] = []

    def fail_half_way(f: BinaryIO) -> None:
        f.write(b"half of the new")
        seen.extend(_entries(tmp_path))  # the temporary file exists beside the target meanwhile
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(target, writer=fail_half_way)
    assert target.read_bytes() == b"the old checkpoint"
    assert _entries(tmp_path) == ["checkpoint.npz"]
    (temp,) = [name for name in seen if name != "checkpoint.npz"]
    assert Path(tmp_path / temp).match(TEMP_GLOB) and temp.startswith(".checkpoint.npz.")


def test_an_interrupt_also_removes_the_temp_file(tmp_path: Path) -> None:
    def interrupted(f: BinaryIO) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "x", writer=interrupted)
    assert _entries(tmp_path) == []


def test_exactly_one_of_data_and_writer(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        atomic_write(tmp_path / "x")
    with pytest.raises(TypeError):
        atomic_write(tmp_path / "x", b"a", writer=lambda f: None)
    assert _entries(tmp_path) == []


def test_leftovers_of_a_crash_are_found_by_their_names(tmp_path: Path) -> None:
    (tmp_path / ".round-3.npz.k2j4x9.tmp").write_bytes(b"a write a crash interrupted")
    (tmp_path / "round-2.npz").write_bytes(b"kept")
    (tmp_path / "notes.tmp.txt").write_bytes(b"kept")
    assert remove_leftovers(tmp_path) == 1
    assert _entries(tmp_path) == ["notes.tmp.txt", "round-2.npz"]
