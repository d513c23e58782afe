"""Compute gaps: who is late by its own compute, and who inherited it.

* a rank's gap is the time from its previous completion (any comm) to its
  next enqueue; back-to-back ops are no compute;
* a late member is slow by its own compute only when its gaps exceed the
  on-time members' gaps before the same ops;
* on the simulator, a power-capped GPU and a loaded host are named where
  half a data-parallel group, or a whole pipeline replica, is late with it.
"""

from __future__ import annotations

import numpy as np
import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.streams.analyze import Replay, to_json
from mycroft.streams.core.collective_stat import CollectiveStat, Members
from mycroft.streams.core.compute_gaps import (
    GAP_RATIO,
    compute_gaps,
    slow_computers,
)
from mycroft.streams.core.rca_timing import PAIR_ROW
from tests.unit.core.test_slow_rules import _stat

MS = 1_000_000


def _op(comm: int, seq: int, ranks: list[int], issue: list[int], end: int):
    return _stat(comm, seq, ranks, issue, [end - max(issue)] * len(ranks))


def _steady(compute: dict[int, float], ops: int) -> list[CollectiveStat]:
    """Each rank alone in its own comm (100 + rank, same seqs), computing
    ``compute[r]`` ms before every op and 1 ms inside it."""
    stats = []
    for r, c in compute.items():
        t = 0
        for seq in range(ops):
            t += int(c * MS)
            stats.append(_op(100 + r, seq, [r], [t], t + MS))
            t += MS
    return stats


def test_gaps_are_compute_between_a_ranks_ops_on_any_comm():
    # Rank 0 alternates two comms; a back-to-back op (issued at the previous
    # completion) adds no gap, an op issued before it ended neither.
    stats = [
        _op(1, 0, [0], [0], 1 * MS),
        _op(2, 0, [0], [4 * MS], 5 * MS),  # 3 ms of compute
        _op(1, 1, [0], [5 * MS], 6 * MS),  # back to back
        _op(2, 1, [0], [9 * MS], 10 * MS),  # 3 ms
        _op(1, 2, [0], [9_500_000], 11 * MS),  # before the previous ended
        _op(2, 2, [0], [14 * MS], 15 * MS),  # 3 ms after the running max
    ]
    gaps = compute_gaps(Members(stats))
    # The first gap (0 -> 4 ms) is before comm 2's first op in the window.
    assert gaps["rank"].tolist() == [0, 0]
    assert gaps["gap"].tolist() == [3 * MS] * 2


def test_gaps_start_where_every_comm_of_the_rank_is_in_the_window():
    # Comm 2 (busy) kept only its ops from 24 ms on; before that, the time
    # between rank 0's comm-1 ops held comm-2 ops the window no longer has.
    stats = [_op(1, seq, [0], [seq * 10 * MS], seq * 10 * MS + MS) for seq in range(6)]
    stats += [_op(2, 9, [0], [24 * MS], 25 * MS), _op(2, 10, [0], [44 * MS], 45 * MS)]
    gaps = compute_gaps(Members(stats))
    # Kept: the gaps whose both ops start from 24 ms on (25 -> 30, 31 ->
    # 40, 41 -> 44, 45 -> 50 ms); not 11 -> 20 nor 21 -> 24.
    assert sorted(gaps["gap"].tolist()) == [3 * MS, 5 * MS, 5 * MS, 9 * MS]


def test_gaps_of_different_ranks_share_keys_at_the_same_op_position():
    gaps = compute_gaps(Members(_steady({0: 2.0, 1: 3.0}, 6)))
    by = {r: gaps[gaps["rank"] == r] for r in (0, 1)}
    assert by[0]["key"].tolist() == by[1]["key"].tolist()
    assert np.allclose(by[0]["gap"], 2 * MS)
    assert np.allclose(by[1]["gap"], 3 * MS)


def _pairs(late: dict[int, float], comm: int = 7) -> np.ndarray:
    rows = [(comm, r, v * MS) for r, v in sorted(late.items())]
    return np.array(rows, PAIR_ROW)


def test_late_ranks_computing_slower_than_the_on_time_ones_are_named():
    # Half the group late (two ranks of one slow host) and computing 1.5x.
    gaps = compute_gaps(Members(_steady({0: 3.0, 1: 3.0, 2: 2.0, 3: 2.0}, 12)))
    pairs = _pairs({0: 60.0, 1: 61.0, 2: -60.0, 3: -61.0})
    found = slow_computers(pairs, gaps, 5 * MS)
    assert sorted(s.rank for s in found) == [0, 1]
    assert found[0].gap_ns == pytest.approx(3 * MS)
    assert found[0].peers_gap_ns == pytest.approx(2 * MS)


def test_late_ranks_computing_at_their_peers_pace_inherited_it():
    gaps = compute_gaps(Members(_steady({0: 2.0, 1: 2.0, 2: 2.0, 3: 2.0}, 12)))
    pairs = _pairs({0: 60.0, 1: 61.0, 2: -60.0, 3: -61.0})
    assert slow_computers(pairs, gaps, 5 * MS) == []
    # Just under the ratio: still not named.
    under = GAP_RATIO - 0.05
    gaps = compute_gaps(Members(_steady({0: 2.0 * under, 1: 2.0, 2: 2.0}, 12)))
    assert slow_computers(_pairs({0: 60.0, 1: -1.0, 2: -1.0}), gaps, 5 * MS) == []


def test_pairs_and_groups_without_an_on_time_member_say_nothing():
    gaps = compute_gaps(Members(_steady({0: 3.0, 1: 2.0, 2: 2.0}, 12)))
    assert slow_computers(_pairs({0: 60.0, 1: -60.0}), gaps, 5 * MS) == []
    assert slow_computers(_pairs({0: 60.0, 1: 60.0, 2: 60.0}), gaps, 5 * MS) == []


def test_gaps_are_compared_op_by_op_not_over_the_window():
    # The late rank's window holds more of its long (backward) gaps than its
    # peers' does, at the same per-op pace: a whole-window median would call
    # it slow.
    def phases(r: int, ops: int) -> list[CollectiveStat]:
        out, t = [], 0
        for seq in range(ops):
            t += (4 if seq % 12 >= 6 else 2) * MS
            out.append(_op(100 + r, seq, [r], [t], t + MS))
            t += MS
        return out

    stats = phases(0, 12) + phases(1, 8) + phases(2, 8)
    gaps = compute_gaps(Members(stats))
    assert np.median(gaps["gap"][gaps["rank"] == 0]) > GAP_RATIO * np.median(
        gaps["gap"][gaps["rank"] == 1]
    )
    assert slow_computers(_pairs({0: 60.0, 1: -30.0, 2: -30.0}), gaps, 5 * MS) == []


def _first_root_cause(fault: str, seed: int, shape: tuple[int, int, int]):
    tp, pp, dp = shape
    cfg = SimConfig(tp=tp, pp=pp, dp=dp, duration_s=24.0, seed=seed)
    rp = Replay()
    res = simulate(cfg, [parse_spec(fault)], rp)
    doc = to_json(*rp.finish(), rp.first_resolved_ns)
    return res.truth()["faults"][0], doc["root_causes"]


@pytest.mark.parametrize(
    ("fault", "shape"),
    [("gpu-power-cap", (2, 4, 8)), ("gpu-background-load", (4, 4, 4))],
)
def test_slow_gpu_behind_a_late_replica_is_named(fault, shape):
    """TP smaller than a host: a power-capped GPU makes its whole pipeline
    replica late at the data-parallel sync (eight ranks on four hosts, alike);
    a loaded host makes half of each data-parallel group of its stage late.
    Lateness alone named a rank of another stage, or nothing."""
    truth, causes = _first_root_cause(fault, 1, shape)
    assert causes, "no root cause"
    best = causes[0]
    assert best["rank"] in truth["ranks"]
    assert best["component"] == "gpu"
