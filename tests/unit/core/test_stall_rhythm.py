"""Stall rhythm: resolved pauses of a comm and its holders bound the next."""

from __future__ import annotations

import pickle

import pytest

from mycroft.schemas.records import Anomaly
from mycroft.schemas.vocab import FaultKind
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
            rh.watch(COMM, holders, start, t - start)
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
    assert "rank 0 pauses every ~30 s for ~3.0 s" in describe(cost)
    assert "10.0 % of the job" in describe(cost)


def test_one_pause_is_no_rhythm_and_overlapping_comms_count_once() -> None:
    rh = StallRhythm(DetectorConfig())
    _pause(rh, 10, 3.0)
    assert rh.costs() == []
    for comm in (COMM, COMM + 1):  # one pause seen by two comms
        start = 40 * S
        rh.step({comm: (start, start + 2 * S, True)})
        rh.watch(comm, RANK0, start, 2 * S)
        rh.step({comm: (start + 3 * S, start + 3 * S, False)})
    (cost,) = rh.costs()
    assert cost.count == 2
    assert cost.comms == (COMM, COMM + 1)


def test_the_rhythm_survives_a_pickle_round_trip() -> None:
    rh = StallRhythm(DetectorConfig())
    _pause(rh, 10, 3.0)
    back = pickle.loads(pickle.dumps(rh))
    assert back.bound_ns((COMM, RANK0)) == rh.bound_ns((COMM, RANK0))


def test_a_stall_inside_an_op_is_never_a_rhythm() -> None:
    rh = StallRhythm(DetectorConfig())
    _pause(rh, 10, 3.0, holders=())  # every member issued: transport or GPU
    _pause(rh, 40, 3.0, holders=())
    assert not rh.recurring(COMM, (), 3 * S)
    assert rh.costs() == []


def _slow(onset_s: float, detected_s: float, comm: int = COMM) -> Anomaly:
    return Anomaly(
        anomaly_id=f"j:slow_span:{onset_s}",
        job_id="j",
        kind=FaultKind.SLOWDOWN,
        comms=(comm,),
        ranks=(0, 1),
        onset_ns=int(onset_s * S),
        detected_ns=int(detected_s * S),
        detector="slow_span",
        summary="span",
    )


def test_only_slowdowns_of_ops_a_recurring_pause_held_up_are_excused() -> None:
    rh = StallRhythm(DetectorConfig())
    _pause(rh, 10, 3.0)  # the first pause: it paged, its op's slowdown stays
    _pause(rh, 40, 3.0)  # recurring
    held = [_slow(9.95, 13.1), _slow(39.95, 43.1)]
    other = [_slow(50, 50.2), _slow(39.95, 43.1, comm=COMM + 1)]
    assert rh.excuse(held + other) == [held[0], *other]
    assert rh.excused == 1
