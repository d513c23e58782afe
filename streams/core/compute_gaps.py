"""Compute time between a rank's collectives, and which late ranks it explains.

A rank's *compute gap* is the time from the completion of its previous op
(on any communicator) to the enqueue of its next one, on its own clock: the
work it does between collectives. The members of a data-parallel group run
the same work, so their gaps match; a GPU slowed by a power cap or a
background load computes longer between the same collectives.

This answers who waited for whom when lateness alone cannot: a slow GPU
holds back its whole pipeline replica, so every rank of the replica arrives
late at the data-parallel sync, by about the same amount (with tensor
parallelism smaller than a host, half of each data-parallel group can be on
the slow host). In a group where some members are late, a late member whose
gap clearly exceeds the gap of the members that were on time is late because
of its own compute; a late member computing at its peers' pace inherited its
lateness.

The rule needs enqueues that follow the previous completion. Where the CPU
runs far ahead of the GPU (every op enqueued before the previous one ended)
the gaps clip to zero and it abstains.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mycroft.streams.core.collective_stat import Members
from mycroft.streams.core.rows import group_ids, group_medians, run_starts

GAP_RATIO = 1.2
"""A late member computes slowly when its gaps are, in the median over the
ops it shares with the on-time members, at least this many times theirs: a
power cap or a background load stretches compute by 1.3x or more; a healthy
rank's gaps over a few dozen ops stay within a few per cent of its peers'."""

GAP_FLOOR_NS = 200_000
"""...and at least this much longer: gaps of a few microseconds (the CPU
enqueues right after each completion) make large ratios of nothing."""

BACK_TO_BACK_NS = 20_000
"""A gap up to this long is two ops enqueued back to back, not compute."""

MIN_GAPS = 5
"""Ops a late member must share gaps before with the on-time members (same
op key) for the median of the ratios."""

MIN_GROUP = 3
"""Members a group needs to compare its late members with the on-time ones.
A pair (a pipeline send/recv) joins ranks of different stages, whose work
between ops differs by design."""


class SlowCompute(NamedTuple):
    """A late rank that computes longer than its group's on-time members."""

    rank: int
    comm: int
    gap_ns: float
    peers_gap_ns: float


GAP_ROW = np.dtype([("rank", "<i8"), ("key", "<i8"), ("gap", "<f8")])
"""A rank's compute gap before one op: ``key`` numbers the op's (kind,
size, seq) over the window, so the same op position of different ranks
(their own comms, same program) shares a key."""


def compute_gaps(mem: Members) -> np.ndarray:
    """Each rank's compute gap before each of its ops of ``mem`` (``GAP_ROW``
    rows sorted by rank then key; one row per (rank, key), the median where
    a key repeats).

    Only gaps above ``BACK_TO_BACK_NS`` count: ops enqueued back to back (a
    pipeline send then a receive, a reduce-scatter then the optimizer's
    first bucket) or before the previous op ended have no compute between
    them. And only gaps whose both ops come after the first op of ``mem`` on
    every comm of the rank: the root cause keeps the last ops of each comm,
    which cover less time on a busy (tensor-parallel) comm than on a quiet
    one, and before that point a gap would span ops (and waits) it cannot
    see.
    """
    if not len(mem.rank):
        return np.empty(0, GAP_ROW)
    seq = np.repeat(mem.seq, mem.size)
    kind = np.repeat(mem.kind, mem.size)
    nbytes = np.repeat(mem.nbytes, mem.size)
    order = np.lexsort((mem.issue, mem.rank))
    rank, issue, end = mem.rank[order], mem.issue[order], mem.end[order]
    first = run_starts(rank)
    seg = np.cumsum(first) - 1
    covered = _covered_from(mem)[seg]
    # Running max of completions per rank in one pass: offset each rank's
    # completions to its own minimum and stack the ranks apart.
    low = np.minimum.reduceat(end, np.flatnonzero(first))[seg]
    rel = end - low
    width = int(rel.max()) + 1
    done = np.maximum.accumulate(seg * width + rel) - seg * width + low
    gap = (issue[1:] - done[:-1]).astype(np.float64)
    seen = (issue[:-1] >= covered[:-1]) & ~first[1:]
    keep = np.flatnonzero(seen & (gap > BACK_TO_BACK_NS)) + 1
    if not len(keep):
        return np.empty(0, GAP_ROW)
    at = order[keep]
    key = group_ids(kind[at], nbytes[at], seq[at])[0]
    pair, firsts = group_ids(rank[keep], key)
    _, med = group_medians(pair, gap[keep - 1])
    out = np.empty(len(firsts), GAP_ROW)
    out["rank"], out["key"], out["gap"] = rank[keep][firsts], key[firsts], med
    return out


def _covered_from(mem: Members) -> np.ndarray:
    """Per rank (ascending), the latest first issue among its comms: from
    there on every op of the rank is in ``mem``."""
    comm = np.repeat(mem.comm, mem.size)
    pair, firsts = group_ids(mem.rank, comm)
    start = np.full(len(firsts), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(start, pair, mem.issue)
    ranks, which = np.unique(mem.rank[firsts], return_inverse=True)
    out = np.full(len(ranks), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(out, which, start)
    return out


def slow_computers(
    pairs: np.ndarray, gaps: np.ndarray, late_floor_ns: float
) -> list[SlowCompute]:
    """Late ranks whose own compute explains their lateness.

    A late member's gaps are compared op by op with the on-time members'
    median gap before the same op (key), and the ratios' median is taken:
    a window catches ranks of a slow pipeline replica in another phase
    (forward and backward compute differ), so whole-window medians would
    compare different work.

    Args:
        pairs: One row per (comm, rank) with fields ``comm``, ``rank`` and
            ``late`` (the rank's median lateness in that comm, ns), sorted
            by comm.
        gaps: ``compute_gaps`` of the same ops.
        late_floor_ns: Lateness that makes a member late in a group.

    Returns:
        One entry per rank (its group with the largest gap ratio), largest
        ratio first.
    """
    if not len(pairs) or not len(gaps):
        return []
    bounds = np.flatnonzero(run_starts(gaps["rank"]))
    where = dict(
        zip(
            gaps["rank"][bounds].tolist(),
            zip(bounds.tolist(), [*bounds[1:].tolist(), len(gaps)], strict=True),
            strict=True,
        )
    )

    def rows_of(ranks: list[int]) -> np.ndarray:
        parts = [gaps[slice(*where[r])] for r in ranks if r in where]
        return np.concatenate(parts) if parts else gaps[:0]

    best: dict[int, tuple[float, SlowCompute]] = {}
    starts = np.flatnonzero(run_starts(pairs["comm"]))
    for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), len(pairs)], strict=True):
        group = pairs[lo:hi]
        late = group["late"] >= late_floor_ns
        if hi - lo < MIN_GROUP or not late.any() or late.all():
            continue
        on_time = rows_of(group["rank"][~late].tolist())
        ref_key, ref_gap = group_medians(on_time["key"], on_time["gap"])
        for r in group["rank"][late].tolist():
            mine = rows_of([r])
            at = np.searchsorted(ref_key, mine["key"])
            hit = at < len(ref_key)
            hit[hit] = ref_key[at[hit]] == mine["key"][hit]
            if hit.sum() < MIN_GAPS:
                continue
            own, ref = mine["gap"][hit], ref_gap[at[hit]]
            ratio = float(np.median(own / np.maximum(ref, 1.0)))
            excess = float(np.median(own - ref))
            if ratio < GAP_RATIO or excess < GAP_FLOOR_NS:
                continue
            if r not in best or ratio > best[r][0]:
                entry = SlowCompute(
                    r,
                    int(group["comm"][0]),
                    float(np.median(own)),
                    float(np.median(ref)),
                )
                best[r] = (ratio, entry)
    ranked = sorted(best.values(), key=lambda x: (-x[0], x[1].rank))
    return [entry for _, entry in ranked]
