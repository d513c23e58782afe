"""Timing evidence of a slowdown, per rank: its lateness, finishing lag and
worst group against its own healthy baseline and its peers in the same window
(``late_scores``), and the components they name (``score_timing``):

| evidence                                                      | component |
|---------------------------------------------------------------|-----------|
| issues ops late (late arrival) and finishes last              | gpu       |
| late in a group, computes longer between ops than its on-time |           |
| members before the same ops (``compute_gaps``)                | gpu       |
| issues on time, gpu_ready lags peers, finishes last           | pcie      |

A late rank that computes at its peers' pace when others in its groups are
late by their own (longer) compute is not named: a slow GPU holds its whole
pipeline replica back, so lateness alone cannot tell which stage it is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from mycroft.schemas.vocab import Component
from mycroft.streams.core.baseline import outliers
from mycroft.streams.core.collective_stat import CollectiveStat, Members
from mycroft.streams.core.compute_gaps import SlowCompute
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.flow_features import FlowFeatures
from mycroft.streams.core.rows import group_ids, group_medians, run_starts
from mycroft.streams.core.suspect import Suspects


class Lateness(NamedTuple):
    """Per-rank timing of the ops completed since the onset.

    ``late`` and ``end_lag`` are medians over every op of the rank (a rank
    late only where it waited on another group stays near zero), in ns.
    ``worst`` is aggregated per (comm, rank) first and the rank's worst comm
    is kept: a host whose ranks all run late is on time inside its own
    (intra-host) groups and late only in the groups that cross hosts, which
    the mixed median hides. ``waits`` holds, for each rank that arrived
    early somewhere (by the op's early cut, against its usual lateness), the
    longest it stood in such an op before the op's last member came (see
    ``waiters``);
    ``ops`` counts each rank's ops; ``pairs`` holds the per (comm, rank)
    medians (``PAIR_ROW`` rows, by comm).
    """

    late: dict[int, float]
    end_lag: dict[int, float]
    waits: dict[int, float]
    worst: dict[int, float]
    ops: dict[int, int]
    pairs: np.ndarray


PAIR_ROW = np.dtype([("comm", "<u8"), ("rank", "<i8"), ("late", "<f8")])


def late_scores(
    ctx: DetectContext, stats: Sequence[CollectiveStat], mem: Members | None = None
) -> Lateness:
    """Return each rank's lateness, finishing lag, worst group and op count,
    and how long the ranks that arrived early somewhere waited there (see
    ``Lateness``); ranks in
    order of their first member row. Every median is one group reduction
    over all member rows (a 1,024-rank slowdown reads ~400,000). ``mem``:
    ``Members(stats)``, when the caller has it."""
    if not stats:
        return Lateness({}, {}, {}, {}, {}, np.empty(0, PAIR_ROW))
    # Waiting in a group means arriving early by a real margin: a fraction of
    # the op and at least the late floor (sub-ms jitter of a tiny collective
    # is no evidence of waiting on anyone).
    early_floor = ctx.cfg.late_floor_s * 1e9
    mem = Members(stats) if mem is None else mem
    e = _member_rows(mem, early_floor)
    comm, rank = e["comm"], e["rank"]
    excess = e["late"] - late_medians(ctx, comm, rank)
    early = excess < -e["cut"]
    stood = (mem.per_op(np.maximum, e["late"])[mem.op] - e["late"])[early]
    waiting, at = np.unique(rank[early], return_inverse=True)
    longest = np.zeros(len(waiting))
    np.maximum.at(longest, at, stood)
    waits = dict(zip(waiting.tolist(), longest.tolist(), strict=True))
    ranks, agg = group_medians(rank, excess)
    _, agg_end = group_medians(rank, e["end_lag"])
    # Per (comm, rank) median of the excess; a rank's worst comm.
    pair, pair_first = group_ids(comm, rank)
    _, pair_med = group_medians(pair, excess)
    pair_rank = rank[pair_first]
    pairs = np.empty(len(pair_first), PAIR_ROW)
    pairs["comm"], pairs["rank"], pairs["late"] = comm[pair_first], pair_rank, pair_med
    by_rank = np.argsort(pair_rank, kind="stable")
    starts = np.flatnonzero(run_starts(pair_rank[by_rank]))
    worst = np.maximum.reduceat(pair_med[by_rank], starts)  # ranks ascending
    _, first, ops = np.unique(rank, return_index=True, return_counts=True)
    seen = np.argsort(first).tolist()
    keys = ranks.tolist()

    def by_first(values: np.ndarray) -> dict[int, float]:
        out = values.tolist()
        return {keys[j]: out[j] for j in seen}

    return Lateness(
        by_first(agg),
        by_first(agg_end),
        waits,
        by_first(worst),
        {keys[j]: int(ops[j]) for j in seen},
        pairs,
    )


def late_medians(ctx: DetectContext, comm: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Median lateness of each (comm, rank) row's baseline; 0.0 for a pair
    whose baseline is missing or not warm."""
    late = ctx.book.families["late"]
    pair, firsts = group_ids(comm, rank)
    found = late.rows.get
    keys = zip(comm[firsts].tolist(), rank[firsts].tolist(), strict=True)
    rows = np.array([found((c, r, "late"), -1) for c, r in keys], np.int64)
    known = rows >= 0
    med = np.zeros(len(rows))
    if known.any():
        warm = late.warm(rows[known])
        med[known] = np.where(warm, late.stats(rows[known])[0], 0.0)
    out: np.ndarray = med[pair]
    return out


def waiters(waits: dict[int, float], late: dict[int, float], floor: float) -> set[int]:
    """The ranks whose lateness their waits explain.

    A rank that stood in an op while its peers came is late afterwards by
    about as long as it stood there: the slowdown it shows came from the
    group it waited on. A wait explains lateness up to its own length, so a
    rank whose median lateness exceeds its longest wait by more than the
    late ``floor`` stays a suspect: a straggler that also arrives a few ms
    early at some other group's op is still the straggler.
    """
    return {r for r, w in waits.items() if late.get(r, 0.0) - w <= floor}


_MEMBER_ROW = np.dtype(
    [
        ("comm", "<u8"),
        ("rank", "<i8"),
        ("late", "<f8"),
        ("end_lag", "<f8"),
        ("cut", "<f8"),
    ]
)


def _member_rows(mem: Members, early_floor: float) -> np.ndarray:
    """One row per (op, member), in op order then member order: the member's
    lateness and end lag (against the op's medians) and the op's early cut
    (``max(0.3 x span, early_floor)``), over all members at once (a
    1,024-rank slowdown reads ~60k ops)."""
    out = np.empty(len(mem.op), dtype=_MEMBER_ROW)
    out["comm"] = np.repeat(mem.comm, mem.size)
    out["rank"] = mem.rank
    out["late"] = mem.off_median(mem.begin)
    out["end_lag"] = mem.off_median(mem.end)
    span = mem.span().astype(np.float64)
    cut = np.maximum(0.3 * np.maximum(span, 1.0), early_floor)
    out["cut"] = np.repeat(cut, mem.size)
    return out


SYMPTOM_SHARE = 0.1
"""A timing suspect's (a rank's or a whole host's) lateness or finishing lag
must reach this share of the largest lateness or lag seen in the incident."""

WORST_GROUP_FLOORS = 4.0
"""Lateness in a rank's worst group alone must clear this many late floors."""


def late_floor(ctx: DetectContext, span: float) -> float:
    """The late floor of ops of median span ``span``: the configured floor,
    or a tenth of the span if larger."""
    return max(ctx.cfg.late_floor_s * 1e9, 0.1 * span)


def symptom_floor(
    ctx: DetectContext,
    span: float,
    worst: dict[int, float],
    end_lag: dict[int, float],
) -> float:
    """The late floor, raised to ``SYMPTOM_SHARE`` of the largest lateness
    or finishing lag of the incident."""
    biggest = max([0.0, *worst.values(), *end_lag.values()])
    return max(late_floor(ctx, span), SYMPTOM_SHARE * biggest)


def score_timing(  # noqa: PLR0917 - the slowdown explainer hands in its state
    ctx: DetectContext,
    suspects: Suspects,
    lateness: tuple[dict[int, float], dict[int, float]],
    end_lag: dict[int, float],
    early: set[int],
    span: float,
    flows: list[FlowFeatures],
    slow: Sequence[SlowCompute] = (),
) -> set[int]:
    """Score late arrivals (gpu) and late copies or finishes (pcie).

    ``lateness`` is (median over all the rank's ops, worst per-comm median).
    ``slow``: late ranks whose own compute explains their lateness
    (``compute_gaps.slow_computers``); when there are any, they are the gpu
    suspects and the ranks late at their pace are not.
    Returns the ranks whose verdict is weak: late in their worst group only,
    or (pcie) only finishing last.
    """
    late, worst = lateness
    # A timing suspect must explain a real share of the slowdown: a rank 6 ms
    # late is jitter beside victims 200 ms late (among 1,000 ranks one is
    # always a few ms out).
    floor = symptom_floor(ctx, span, worst, end_lag)
    late_out = {r: v for r, v in outliers(late, floor).items() if r not in early}
    weak: set[int] = set()
    if slow:
        late_out = _score_slow_compute(ctx, suspects, slow, worst, span)
    elif not late_out and not suspects:
        # A rank late in one group only (it computes before that group's op,
        # on time for the next one) has as many on-time ops as late ones:
        # its median over every op hides it. When nothing else (flows, a
        # whole host) explains the slowdown, its worst group speaks, if
        # clearly (a worst of many groups is noisy) and revisably.
        late_out = {
            r: v
            for r, v in outliers(worst, floor).items()
            if r not in early and v >= WORST_GROUP_FLOORS * floor
        }
        weak.update(late_out)
    for r, excess in ({} if slow else late_out).items():  # else scored above
        sus = suspects.at(r)
        mates = ctx.topo.ranks_on_host(ctx.topo.host_of(r))
        whole = len(mates) > 1 and all(m in late_out for m in mates)
        sus.add(
            Rule.LATE_ARRIVAL,
            f"arrives {excess / 1e6:.1f} ms late"
            + (" with every rank of its host" if whole else ""),
            score=suspects.rca.timing_score(Rule.LATE_ARRIVAL, excess, span),
        )
    ready = {f.rank: f.ready for f in flows}
    deficit = {r: -v for r, v in ready.items()}
    for r, d in outliers(deficit, 0.1).items():
        if r not in late_out:
            suspects.at(r).add(
                Rule.READY_LAGS,
                f"gpu_ready lags peers by {d:.0%} of the op "
                "while it issues on time (copies late)",
                score=suspects.rca.plus(Rule.READY_LAGS, d),
            )
    lag_out = outliers(end_lag, floor)
    for r, excess in lag_out.items():
        if r in late_out or r in early:
            continue
        founded = r in suspects and Component.PCIE in suspects[r].scores
        others = [v for k, v in ready.items() if k != r]
        behind = r in ready and others and ready[r] < float(np.median(others)) - 0.05
        if not (behind or founded) and late_out:
            continue  # who finishes last behind a late arrival is ring order
        sus = suspects.at(r)
        bonus = suspects.rca.ready_behind_bonus if behind else 0.0
        sus.add(
            Rule.FINISHES_LAST,
            f"issues on time but finishes {excess / 1e6:.1f} ms after the median"
            + ("; gpu_ready lags peers" if behind else ""),
            score=suspects.rca.timing_score(
                Rule.FINISHES_LAST, excess, span, bonus=bonus
            ),
        )
        if not (behind or founded):
            weak.add(r)
    return weak


def _score_slow_compute(
    ctx: DetectContext,
    suspects: Suspects,
    slow: Sequence[SlowCompute],
    worst: dict[int, float],
    span: float,
) -> dict[int, float]:
    """Name the GPUs of ``slow`` (late by their own compute): one suspect per
    host, as a host-wide load slows every GPU of the host and is one cause
    (an existing gpu suspect of the host, e.g. the whole-host rule's, carries
    it). Returns the ranks of ``slow`` with their worst lateness."""
    by_host: dict[str, list[SlowCompute]] = {}
    for s in slow:
        by_host.setdefault(ctx.topo.host_of(s.rank), []).append(s)
    for host, mine in by_host.items():
        top = mine[0]
        held = [
            r
            for r in ctx.topo.ranks_on_host(host)
            if r in suspects and Component.GPU in suspects[r].scores
        ]
        # The lowest flagged rank of a host-wide load: the top ratio among
        # equally slowed GPUs changes from one refresh to the next.
        rep = held[0] if held else min(s.rank for s in mine)
        why = (
            f"computes {top.gap_ns / 1e6:.2f} ms between ops where the on-time "
            f"members of its group compute {top.peers_gap_ns / 1e6:.2f} ms: "
            f"late {worst.get(top.rank, 0.0) / 1e6:.1f} ms by its own compute"
        )
        if len(mine) > 1:
            why = f"ranks {sorted(s.rank for s in mine)} of host {host}: " + why
            why += " (host-wide GPU load)"
        lead = max(worst.get(s.rank, 0.0) for s in mine)
        suspects.at(rep).add(
            Rule.SLOW_COMPUTE,
            why,
            score=suspects.rca.timing_score(Rule.SLOW_COMPUTE, lead, span, capped=True),
        )
    return {s.rank: worst.get(s.rank, 0.0) for s in slow}
