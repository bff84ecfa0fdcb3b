"""Round bookkeeping without sockets: instructions per (device, phase), quorum, vanished devices."""

from __future__ import annotations

import pytest

from orchestrator.rounds import RoundState, sample_devices


def test_a_round_with_two_phases_settles_only_when_every_instruction_is_answered():
    rs = RoundState(3, deadline=100.0, quorum=0.5)
    for d in ("a", "b", "c", "d"):
        rs.issue(d, "train")
    with pytest.raises(ValueError, match="already has a 'train' instruction"):
        rs.issue("a", "train")
    rs.on_report("a", "train", True)
    assert not rs.quorum_reached("train")
    rs.on_report("b", "train", False)  # refused reports do not count towards the quorum
    assert not rs.quorum_reached("train")
    rs.on_report("c", "train", True)
    assert rs.quorum_reached("train") and not rs.settled()
    rs.issue("a", "compare")  # a follow-up phase
    assert rs.expects("a") and rs.expects("a", "compare") and not rs.expects("a", "train")
    with pytest.raises(KeyError):
        rs.on_report("a", "train", True)  # answered once only
    assert rs.on_gone("d") == ["train"] and rs.outstanding == {("a", "compare")}
    assert rs.on_back("d") == ["train"] and ("d", "train") in rs.outstanding
    rs.on_gone("d")
    rs.on_report("a", "compare", True)
    assert rs.settled()
    assert rs.reported() == {"a", "c"} and rs.reported("compare") == {"a"} and rs.refused() == {"b"}
    assert rs.stragglers() == {"d"} and rs.selected == {"a", "b", "c", "d"}


def test_a_closed_round_expects_no_report():
    """Once the round stops waiting (its stragglers given up), it aggregates and checks the result
    over several awaits; an upload that completes then is late (acknowledged as such), never folded."""
    rs = RoundState(5, deadline=100.0)
    for d in ("a", "b"):
        rs.issue(d, "train")
    rs.on_report("a", "train", True)
    rs.close()
    assert not rs.expects("b") and not rs.expects("b", "train")
    assert rs.stragglers() == {"b"} and rs.reported() == {"a"}


def test_sampling_is_reproducible_and_takes_a_fraction_or_a_count():
    pool = [f"d{i}" for i in range(10)]
    assert sample_devices(pool, 0.3, 1, 7) == sample_devices(reversed(pool), 0.3, 1, 7)
    assert len(sample_devices(pool, 0.3, 1, 7)) == 3
    assert sample_devices(pool, 0.3, 1, 7) != sample_devices(pool, 0.3, 2, 7)
    assert len(sample_devices(pool, 1.0, 1, 7, k=4)) == 4
    assert sample_devices([], 0.5, 1, 0) == []
    with pytest.raises(ValueError):
        sample_devices(pool, 0.0, 1, 0)
