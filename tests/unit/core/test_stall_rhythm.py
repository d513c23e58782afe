"""Stall rhythm: resolved pauses of a comm and its holders bound the next."""

from __future__ import annotations

import pickle

import pytest

from mycroft.streams.core.config import DetectorConfig, with_overrides
from mycroft.streams.core.stall_rhythm import StallRhythm, describe

S = 1_000_000_000
COMM, RANK0 = 0x10, (0,)


def _pause(rh: StallRhythm, start_s: float, length_s: float, holders=RANK0) -> None:
    """Drive one stall of ``COMM`` from ``start_s`` for ``length_s`` through
    evaluations every 100 ms, then one evaluation after it resolved."""
    start = int(start_s * S)
    t = start
    while t - start < length_s * S:
        rh.step({COMM: (start, t, True)})
        if t - start >= rh.cfg.rhythm_min_s * S:
            rh.watch(COMM, holders, start)
        t += S // 10
    end = start + int(length_s * S)
    rh.step({COMM: (end, end + S // 10, False)})


def test_a_first_stall_has_no_bound() -> None:
    rh = StallRhythm(DetectorConfig())
    assert not rh.recurring(COMM, RANK0, 3 * S)
    assert rh.bound_ns((COMM, RANK0)) is None


def test_a_resolved_pause_bounds_the_next_of_the_same_comm_and_holders() -> None:
    rh = StallRhythm(DetectorConfig())
    _pause(rh, 10, 3.0)
    assert rh.bound_ns((COMM, RANK0)) == pytest.approx(6 * S, rel=0.05)
    assert rh.recurring(COMM, RANK0, int(5.5 * S))
    assert not rh.recurring(COMM, RANK0, int(6.5 * S))  # past the bound: a hang
    assert not rh.recurring(COMM, (1,), 3 * S)  # other holders
    assert not rh.recurring(COMM + 1, RANK0, 3 * S)  # another comm


def test_short_stalls_are_not_remembered() -> None:
    rh = StallRhythm(DetectorConfig())
    _pause(rh, 10, 0.3)
    assert rh.bound_ns((COMM, RANK0)) is None


def test_the_bound_multiple_is_a_setting() -> None:
    rh = StallRhythm(with_overrides(DetectorConfig(), "rhythm_mult=1.2"))
    _pause(rh, 10, 3.0)
    assert not rh.recurring(COMM, RANK0, int(4 * S))
    with pytest.raises(ValueError, match="rhythm_mult is a ratio"):
        with_overrides(DetectorConfig(), "rhythm_mult=0.5")


def test_costs_count_recurring_pauses_and_their_share_of_the_job() -> None:
    rh = StallRhythm(DetectorConfig())
    rh.step({COMM: (1, 1, False)})  # the job starts near 0
    for k in range(4):
        _pause(rh, 10 + 30 * k, 3.0)
    rh.step({COMM: (120 * S, 120 * S, False)})
    (cost,) = rh.costs()
    assert (cost.holders, cost.count) == (RANK0, 4)
    assert cost.total_s == pytest.approx(12.0, rel=0.02)
    assert cost.every_s == pytest.approx(30.0, rel=0.02)
    assert cost.share == pytest.approx(0.1, rel=0.02)
    assert "rank 0 pause every ~30 s for ~3.0 s" in describe(cost)
    assert "10.0 % of the job" in describe(cost)


def test_one_pause_is_no_rhythm_and_overlapping_comms_count_once() -> None:
    rh = StallRhythm(DetectorConfig())
    _pause(rh, 10, 3.0)
    assert rh.costs() == []
    for comm in (COMM, COMM + 1):  # one pause seen by two comms
        start = 40 * S
        rh.step({comm: (start, start + 2 * S, True)})
        rh.watch(comm, RANK0, start)
        rh.step({comm: (start + 3 * S, start + 3 * S, False)})
    (cost,) = rh.costs()
    assert cost.count == 2
    assert cost.comms == (COMM, COMM + 1)


def test_the_rhythm_survives_a_pickle_round_trip() -> None:
    rh = StallRhythm(DetectorConfig())
    _pause(rh, 10, 3.0)
    back = pickle.loads(pickle.dumps(rh))
    assert back.bound_ns((COMM, RANK0)) == rh.bound_ns((COMM, RANK0))
