"""Root cause of a slowdown: the link evidence of flows, the timing evidence of
ranks and hosts, and the ranking of what they name.

Per rank, against its own healthy baseline and its peers in the same window:

| evidence                                                        | component |
|-----------------------------------------------------------------|-----------|
| cross-host flows' G-T or T-D out of band (``link_rules``)       | link (*)  |
| late arrival, slow compute (``rca_timing``)                     | gpu       |
| every rank of one host arrives late (``rca_hosts``)             | gpu       |
| ready lag, finishing last (``rca_timing``)                      | pcie      |
| wire time of the transfers through one part (``rca_transfers``) | (**)      |

(*) nic, network, proxy or pcie: the part the flagged flows share.
(**) pcie (a rank's path), nic or network (a host): the part the slowed
transfers share.

A rank that arrives *early* in some group (it waited there) is explained by
that group's late rank, as far as its wait there covers its lateness
(``rca_timing.waiters``): this follows a slowdown across groups to its origin.
So is a receiver that was at an op before its inbound transfer froze at the
sender, and any other member of that op there before it (a ring passes the
frozen data on): its lateness afterwards is the wait
(``_waited_on_transfers``).
Whole-host, worst-group, finish-only and few-op timing verdicts are capped
so that later flow evidence can revise them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import numpy as np

from mycroft.schemas.records import Culprit, Evidence
from mycroft.schemas.vocab import RECV, Component, FaultKind
from mycroft.streams.core.baseline import outliers
from mycroft.streams.core.collective_stat import CollectiveStat, Members
from mycroft.streams.core.compute_gaps import compute_gaps, slow_computers
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.flow_features import FlowFeatures, flow_features
from mycroft.streams.core.hold_back import score_holds
from mycroft.streams.core.link_rules import score_links
from mycroft.streams.core.rca_hosts import score_whole_hosts
from mycroft.streams.core.rca_ports import nominate_flapping_ports, score_port_events
from mycroft.streams.core.rca_timing import (
    late_floor,
    late_medians,
    late_scores,
    score_timing,
    symptom_floor,
    waiters,
)
from mycroft.streams.core.rca_transfers import (
    score_transfers,
    score_uplinks,
    wire_view,
)
from mycroft.streams.core.scoring import PEERS
from mycroft.streams.core.suspect import Suspects, explain_away, rank_suspects
from mycroft.streams.core.transfer_times import NO_PAIRS


def _waited_on_transfers(
    flows: list[FlowFeatures],
    stats: Sequence[CollectiveStat],
    hist: np.ndarray | None = None,
) -> dict[int, str]:
    """Receivers that had issued an op before its inbound transfer froze
    (and the op's other members there before it: :func:`_members_waited`).

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
            _members_waited(f, st, out)
            continue
        if recv is None:
            continue
        seen = recv["tick_ns"][
            (recv["rank"] == f.peer)
            & (recv["peer"] == f.rank)
            & (recv["comm"] == np.uint64(f.comm))
            & (recv["seq"] == f.freeze_seq)
        ]
        if len(seen) and int(seen.min()) <= _cut(f):
            out[f.peer] = _why(f, f.peer)
    return out


def _cut(f: FlowFeatures) -> int:
    """The latest enqueue that counts as there before ``f`` froze: halfway
    through its longest freeze."""
    return f.freeze_start_ns + f.longest_freeze_ns // 2


def _why(f: FlowFeatures, r: int) -> str:
    """Why rank ``r``, there before ``f`` froze, waited."""
    held = "" if r == f.peer else f" to rank {f.peer} in it"
    return (
        f"had issued op {f.freeze_seq} before the transfer from rank {f.rank}"
        f"{held} froze for {f.longest_freeze_ns / 1e9:.1f} s with its data "
        "ready: it is late because it waited"
    )


def _members_waited(f: FlowFeatures, st: CollectiveStat, out: dict[int, str]) -> None:
    """The members of a collective whose transfer froze at its sender that
    were there before the freeze: its receiver, and in a ring or a tree
    every other member too (they pass the frozen data on, and no member
    completes without it). The frozen sender is never one."""
    joined = len(st.ranks) > PEERS
    cut = _cut(f)
    for r, issued in zip(st.ranks.tolist(), st.issue_ns.tolist(), strict=True):
        if r == f.rank or r in out or issued > cut or (r != f.peer and not joined):
            continue
        out[r] = _why(f, r)


def _stopped(ctx: DetectContext, flows: list[FlowFeatures]) -> frozenset[int]:
    """Ranks with a send to another host that stopped (``FlowFeatures.stopped``)."""
    host_of = ctx.topo.host_of
    return frozenset(
        f.rank for f in flows if f.stopped and host_of(f.rank) != host_of(f.peer)
    )


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
    wire = wire_view(ctx, since_ns)
    score_links(ctx, suspects, flows, wire.pairs if wire else NO_PAIRS)
    named = score_transfers(suspects, wire, partial(_stopped, ctx, flows))
    _merge_nic_mates(ctx, suspects)
    nominate_flapping_ports(ctx, suspects, since_ns)
    score_port_events(ctx, suspects, since_ns)
    mem = Members(stats)
    spans = mem.span()
    late, end_lag, waits, worst, ops, pairs = late_scores(ctx, stats, mem)
    span = float(np.median(spans)) if stats else 0.0
    floor = late_floor(ctx, span)
    waited = _waited_on_transfers(flows, stats, hist)
    early = waiters(waits, late, floor) | set(waited)
    evidence.extend(Evidence(why, r) for r, why in sorted(waited.items()))
    singles = {r for r in outliers(late, floor) if r not in early}
    # A whole host must explain a real share of the slowdown too: among 128
    # hosts one is always a few ms late in its worst group.
    share = symptom_floor(ctx, span, worst, end_lag)
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
    weak = score_timing(ctx, suspects, (late, worst), end_lag, early, span, flows, slow)
    if not (outliers(late, floor) or outliers(worst, share) or slow):
        # Nobody is late: a part whose transfers all stretched, within the
        # NIC-share margin, is read as the wire check read it.
        score_uplinks(suspects, wire, ctx.cfg.wire_alarm_llr, named)
    if not suspects:
        # Holding a group back is the last timing evidence read, when nothing
        # else named a suspect, and revisable like a worst-group verdict: a
        # rank downstream of a slow one holds its group at the same place of
        # every step too, before the flows that name the cause accumulate.
        usual = late_medians(ctx, np.repeat(mem.comm, mem.size), mem.rank)
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
    # revise them. So is a timing verdict on fewer than min_timing_ops ops,
    # and every verdict while the wire timing has measured nothing since the
    # onset (`WireView.pending`): flow gaps spread from where they build up
    # (a capped NIC backs up the flows of the GPUs it serves and of their
    # receivers alike), and the measurement at the parts, a fraction of a
    # second away, may tell their ends apart.
    ranked = [
        replace(c, confidence=min(c.confidence, rca.hostwide_conf))
        if (c.rank in hostwide and c.component is Component.GPU)
        or (c.rank in weak and c.component in (Component.GPU, Component.PCIE))
        or (wire is not None and wire.pending)
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
