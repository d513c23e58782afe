"""Root cause of a slowdown: timing rules over completions, and the link
evidence of flows (``link_rules``: G/T/D gaps of cross-host flows).

Per rank, against its own healthy baseline and its peers in the same window:

| evidence                                                      | component |
|---------------------------------------------------------------|-----------|
| cross-host flows' G-T or T-D out of band (``link_rules``)     | link (*)  |
| issues ops late (late arrival) and finishes last              | gpu       |
| late in a group, computes longer between ops than its on-time |           |
| members before the same ops (``compute_gaps``)                | gpu       |
| every rank of one host arrives late                           | gpu       |
| issues on time, gpu_ready lags peers, finishes last           | pcie      |

(*) nic, network, proxy or pcie: the part the flagged flows share.

A rank that arrives *early* in some group (it waited there) is explained by
that group's late rank: this follows a slowdown across groups to its origin.
So is a receiver that was at an op before its inbound transfer froze at the
sender: its lateness afterwards is the wait (``_waited_on_transfers``). And
so is a late rank that computes at its peers' pace when others in its groups
are late by their own (longer) compute: a slow GPU holds its whole pipeline
replica back, so lateness alone cannot tell which stage it is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from mycroft.schemas.records import Culprit, Evidence
from mycroft.schemas.vocab import RECV, Component, FaultKind
from mycroft.streams.core.baseline import outliers
from mycroft.streams.core.collective_stat import CollectiveStat, Members
from mycroft.streams.core.compute_gaps import SlowCompute, compute_gaps, slow_computers
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.flow_features import FlowFeatures, flow_features
from mycroft.streams.core.hold_back import score_holds
from mycroft.streams.core.link_rules import score_links
from mycroft.streams.core.rca_hosts import score_whole_hosts
from mycroft.streams.core.rca_ports import nominate_flapping_ports, score_port_events
from mycroft.streams.core.rows import group_ids, group_medians, run_starts
from mycroft.streams.core.scoring import PEERS
from mycroft.streams.core.suspect import Suspects, explain_away, rank_suspects


def _waited_on_transfers(
    flows: list[FlowFeatures],
    stats: Sequence[CollectiveStat],
    hist: np.ndarray | None = None,
) -> dict[int, str]:
    """Receivers that had issued an op before its inbound transfer froze.

    A sender's T standing still while its data is ready, after the receiver
    issued the op, is a stall on the sending side (its proxy, its NIC, the
    link): the receiver is late afterwards because it waited, as a rank that
    arrives early somewhere waited there. A receiver that issued the op only
    halfway through the freeze or later is what the sender waited on, and
    stays a suspect. Returns ``{receiver: reason}``.

    Arrival is the enqueue (``issue_ns``): a receive's first progress is its
    first data, which comes after the freeze whoever caused it. A receiver
    whose CPU enqueues far ahead of a slow GPU would pass for one that
    waited, but only behind a freeze of ``FREEZE_NS`` or more that began
    while it was already there, which a GPU a few ms slow per op does not
    cause.

    An op not among ``stats`` is still in flight, or one end's completions
    have not arrived yet (live, hosts report in any order, and the frozen
    sender's own completion comes last). Its receiver's arrival is then the
    first snapshot in ``hist`` (``FLAT_FLOW``) holding its receive flow of
    the op: a tick at or after the enqueue.
    """
    frozen = [f for f in flows if f.freeze_seq >= 0 and f.rank != f.peer]
    if not frozen:
        return {}
    wanted = {(f.comm, f.freeze_seq) for f in frozen}
    ops = {(st.comm, st.seq): st for st in stats if (st.comm, st.seq) in wanted}
    recv = hist[hist["dir"] == RECV] if hist is not None else None
    out: dict[int, str] = {}
    for f in sorted(frozen, key=lambda f: -f.longest_freeze_ns):
        if f.peer in out:
            continue
        st = ops.get((f.comm, f.freeze_seq))
        if st is not None:
            at = np.flatnonzero(st.ranks == f.peer)
            if not len(at):
                continue
            issued = int(st.issue_ns[at[0]])
        elif recv is not None:
            seen = recv["tick_ns"][
                (recv["rank"] == f.peer)
                & (recv["peer"] == f.rank)
                & (recv["comm"] == np.uint64(f.comm))
                & (recv["seq"] == f.freeze_seq)
            ]
            if not len(seen):
                continue
            issued = int(seen.min())
        else:
            continue
        if issued <= f.freeze_start_ns + f.longest_freeze_ns // 2:
            out[f.peer] = (
                f"had issued op {f.freeze_seq} before the transfer from rank "
                f"{f.rank} froze for {f.longest_freeze_ns / 1e9:.1f} s with its "
                "data ready: it is late because it waited"
            )
    return out


class Lateness(NamedTuple):
    """Per-rank timing of the ops completed since the onset.

    ``late`` and ``end_lag`` are medians over every op of the rank (a rank
    late only where it waited on another group stays near zero), in ns.
    ``worst`` is aggregated per (comm, rank) first and the rank's worst comm
    is kept: a host whose ranks all run late is on time inside its own
    (intra-host) groups and late only in the groups that cross hosts, which
    the mixed median hides. ``early`` holds the ranks that waited somewhere;
    ``ops`` counts each rank's ops; ``pairs`` holds the per (comm, rank)
    medians (``PAIR_ROW`` rows, by comm).
    """

    late: dict[int, float]
    end_lag: dict[int, float]
    early: set[int]
    worst: dict[int, float]
    ops: dict[int, int]
    pairs: np.ndarray


PAIR_ROW = np.dtype([("comm", "<u8"), ("rank", "<i8"), ("late", "<f8")])


def _late_scores(
    ctx: DetectContext, stats: Sequence[CollectiveStat], mem: Members | None = None
) -> Lateness:
    """Return each rank's lateness, finishing lag, worst group and op count,
    and the ranks that arrived early somewhere (see ``Lateness``); ranks in
    order of their first member row. Every median is one group reduction
    over all member rows (a 1,024-rank slowdown reads ~400,000). ``mem``:
    ``Members(stats)``, when the caller has it."""
    if not stats:
        return Lateness({}, {}, set(), {}, {}, np.empty(0, PAIR_ROW))
    # Waiting in a group means arriving early by a real margin: a fraction of
    # the op and at least the late floor (sub-ms jitter of a tiny collective
    # is no evidence of waiting on anyone).
    early_floor = ctx.cfg.late_floor_s * 1e9
    e = _member_rows(Members(stats) if mem is None else mem, early_floor)
    comm, rank = e["comm"], e["rank"]
    excess = e["late"] - _late_medians(ctx, comm, rank)
    early = set(rank[excess < -e["cut"]].tolist())
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
        early,
        by_first(worst),
        {keys[j]: int(ops[j]) for j in seen},
        pairs,
    )


def _late_medians(ctx: DetectContext, comm: np.ndarray, rank: np.ndarray) -> np.ndarray:
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


def explain_slowdown(
    ctx: DetectContext,
    stats: Sequence[CollectiveStat],
    since_ns: int,
    *,
    every_comm: bool = True,
) -> tuple[list[Culprit], list[Evidence]]:
    """Return culprits (best first) and evidence for a slowdown.

    Args:
        ctx: Detector context (baselines give each rank's healthy lateness).
        stats: Collectives completed since the onset, every comm.
        since_ns: Onset; flow snapshots from there on are examined.
        every_comm: Whether ``stats`` holds every comm of its ranks. A
            stage-1 worker of the two-stage path sees only its comm groups:
            the time between a rank's ops there spans its ops (and waits) in
            comms it does not see, so compute gaps are not read.
    """
    suspects = Suspects(ctx.cfg.rca)
    evidence: list[Evidence] = []
    hist = ctx.store.flow_history(since_ns)
    flows = flow_features(hist, _host_codes(ctx, hist), _receive_reporters(ctx, hist))
    score_links(ctx, suspects, flows)
    _merge_nic_mates(ctx, suspects)
    nominate_flapping_ports(ctx, suspects, since_ns)
    score_port_events(ctx, suspects, since_ns)
    mem = Members(stats)
    spans = mem.span()
    late, end_lag, early, worst, ops, pairs = _late_scores(ctx, stats, mem)
    waited = _waited_on_transfers(flows, stats, hist)
    early |= set(waited)
    evidence.extend(Evidence(why, r) for r, why in sorted(waited.items()))
    span = float(np.median(spans)) if stats else 0.0
    floor = _late_floor(ctx, span)
    singles = {r for r in outliers(late, floor) if r not in early}
    # A whole host must explain a real share of the slowdown too: among 128
    # hosts one is always a few ms late in its worst group.
    share = _symptom_floor(ctx, span, worst, end_lag)
    hostwide = score_whole_hosts(
        ctx,
        suspects,
        outliers(worst, share),
        stats,
        span,
        singles=singles,
        mem=mem,
        spans=spans,
    )
    slow = (
        [
            s
            for s in slow_computers(pairs, compute_gaps(mem), share)
            if s.rank not in early
        ]
        if every_comm
        else []
    )
    weak = _score_timing(
        ctx, suspects, (late, worst), end_lag, early, span, flows, slow
    )
    if not suspects:
        # Holding a group back is the last timing evidence read, when nothing
        # else named a suspect, and revisable like a worst-group verdict: a
        # rank downstream of a slow one holds its group at the same place of
        # every step too, before the flows that name the cause accumulate.
        usual = _late_medians(ctx, np.repeat(mem.comm, mem.size), mem.rank)
        weak |= score_holds(suspects, mem, usual, floor, ctx.cfg, early)
    rca = suspects.rca
    weak |= {r for r in suspects if ops.get(r, 0) < rca.min_timing_ops}
    explain_away(suspects)
    for st in list(stats)[-3:]:
        evidence.append(
            Evidence(
                f"seq {st.seq} span {st.span_ns / 1e6:.1f} ms, last "
                f"arrival rank {int(st.ranks[np.argmax(st.issue_ns)])}",
                comm=st.comm,
                op_seq=st.seq,
            )
        )
    for sus in suspects.values():
        evidence.extend(Evidence(w, sus.rank) for w in sus.reasons[:3])
    ranked = rank_suspects(ctx.topo, suspects, FaultKind.SLOWDOWN)
    # A host-wide timing verdict is ambiguous (a host behind a slow NIC is
    # late as a whole too) until G/T/D evidence accumulates, and so are a
    # rank late in its worst group only and a rank that only finishes last
    # (without flow counters, e.g. on gloo, a neighbour of a straggler can
    # finish last before the straggler's own late arrivals are counted):
    # their confidence is capped so that a later, better-founded culprit can
    # revise them. So is a timing verdict on fewer than min_timing_ops ops.
    ranked = [
        replace(c, confidence=min(c.confidence, rca.hostwide_conf))
        if (c.rank in hostwide and c.component is Component.GPU)
        or (c.rank in weak and c.component in (Component.GPU, Component.PCIE))
        else c
        for c in ranked
    ]
    return ranked, evidence


def _host_codes(ctx: DetectContext, hist: np.ndarray) -> np.ndarray:
    """A host id per rank (index) up to the largest rank or peer in ``hist``."""
    if not len(hist):
        return np.zeros(0, dtype=np.int64)
    top = int(max(hist["rank"].max(), hist["peer"].max())) + 1
    codes: dict[str, int] = {}
    host_of = ctx.topo.host_of
    return np.array([codes.setdefault(host_of(r), len(codes)) for r in range(top)])


def _receive_reporters(ctx: DetectContext, hist: np.ndarray) -> np.ndarray:
    """Per rank (index, as :func:`_host_codes`): whether its host's producer
    has reported receive flows (``ProgressStore`` keeps it per host)."""
    if not len(hist):
        return np.zeros(0, dtype=bool)
    top = int(max(hist["rank"].max(), hist["peer"].max())) + 1
    hosts = ctx.store.hosts
    return np.array(
        [
            (hs := hosts.get(ctx.topo.host_of(r))) is not None and hs.reports_recv
            for r in range(top)
        ],
        dtype=bool,
    )


def _merge_nic_mates(ctx: DetectContext, suspects: Suspects) -> None:
    """GPUs sharing a NIC are one NIC: their link scores (nic / proxy /
    network) go to the mate with the strongest one instead of splitting the
    confidence between equally attached ranks."""
    link = (Component.NIC, Component.PROXY, Component.NETWORK)
    done: set[int] = set()
    for r in sorted(suspects):
        mates = [m for m in ctx.topo.ranks_on_nic(r) if m in suspects and m not in done]
        done.update(mates)
        with_link = [m for m in mates if any(c in suspects[m].scores for c in link)]
        if len(with_link) < PEERS:
            continue
        rep = max(
            with_link,
            key=lambda m: (max(suspects[m].scores.get(c, 0.0) for c in link), -m),
        )
        for m in with_link:
            if m != rep:
                suspects[rep].take(suspects[m], link)


def _late_floor(ctx: DetectContext, span: float) -> float:
    return max(ctx.cfg.late_floor_s * 1e9, 0.1 * span)


def _symptom_floor(
    ctx: DetectContext,
    span: float,
    worst: dict[int, float],
    end_lag: dict[int, float],
) -> float:
    """The late floor, raised to ``SYMPTOM_SHARE`` of the largest lateness
    or finishing lag of the incident."""
    biggest = max([0.0, *worst.values(), *end_lag.values()])
    return max(_late_floor(ctx, span), SYMPTOM_SHARE * biggest)


def _score_timing(  # noqa: PLR0917 - private helper of one module
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
    floor = _symptom_floor(ctx, span, worst, end_lag)
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
