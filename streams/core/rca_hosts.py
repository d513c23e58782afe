"""Host-wide timing of a slowdown: every rank of a host late, and which GPU
of it holds the host back.

A host whose every rank arrives late, whose own intra-host collectives
slowed against other hosts' of the same (op kind, size), and whose flows
explain nothing (no nic, proxy or network evidence) is one cause: a
host-wide GPU load, or the one GPU that starts last inside the host's own
groups (``HOST_WIDE_LATE``, capped: a host behind a slow NIC is late too).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mycroft.schemas.vocab import Component
from mycroft.streams.core.baseline import outliers, size_buckets
from mycroft.streams.core.collective_stat import CollectiveStat, Members
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.rows import group_ids, group_medians
from mycroft.streams.core.scoring import MAJORITY, PEERS
from mycroft.streams.core.suspect import Suspects


def _intra_host_slowdown(
    ctx: DetectContext, mem: Members, spans: np.ndarray | None = None
) -> dict[str, float]:
    """Per host with intra-host collectives: +1 if their spans are slower than
    the other hosts' intra-host collectives of the same (op kind, size), else
    -1 (a peer comparison: a temporal baseline of sub-ms spans absorbs a
    slowdown below its absolute floor). ``spans``: each op's ``span_ns``
    (default ``mem.span()``).

    A comm is intra-host when its first op's members (two or more) share
    one host. The per-op work is columnar (one median per (kind, size,
    host) group); only the per-host ratios are Python.
    """
    if not len(mem.size):
        return {}
    _, first, which = np.unique(mem.comm, return_index=True, return_inverse=True)
    names: dict[str, int] = {}
    host_of_comm = np.full(len(first), -1, np.int64)
    for j, i in enumerate(first.tolist()):
        ranks = mem.ranks_of(i).tolist()
        on = {ctx.topo.host_of(r) for r in ranks}
        if len(ranks) >= PEERS and len(on) == 1:
            host_of_comm[j] = names.setdefault(on.pop(), len(names))
    host = host_of_comm[which.ravel()]
    keep = host >= 0
    if not keep.any():
        return {}
    if spans is None:
        spans = mem.span()
    kind, size = mem.kind[keep], size_buckets(mem.nbytes[keep])
    host = host[keep]
    group, rows = group_ids(kind, size, host)
    _, med = group_medians(group, spans[keep].astype(np.float64))
    pair = group_ids(kind[rows], size[rows])[0]  # groups of one (kind, size)
    hostname = list(names)
    ratios: dict[str, list[float]] = {}
    for p in range(int(pair.max()) + 1):
        of = np.flatnonzero(pair == p)
        if len(of) < MAJORITY:
            continue
        ref = max(float(np.median(med[of])), 1.0)
        for j in of.tolist():
            ratios.setdefault(hostname[host[rows[j]]], []).append(med[j] / ref)
    agg = {h: float(np.median(v)) for h, v in ratios.items()}
    slow = outliers(agg, 0.1)
    return {h: (1.0 if h in slow else -1.0) for h in agg}


def score_whole_hosts(
    ctx: DetectContext,
    suspects: Suspects,
    late: dict[int, float],
    stats: Sequence[CollectiveStat],
    span: float,
    *,
    singles: frozenset[int] | set[int] = frozenset(),
    mem: Members | None = None,
    spans: np.ndarray | None = None,
) -> set[int]:
    """Every rank of a host arrives late: one cause (a host-wide GPU load),
    not one suspect per rank splitting the confidence; one representative
    (its latest rank) carries the host's score. Only when the host's own
    intra-host collectives slowed too: a host late only in groups that cross
    hosts is waiting on another host (a pipeline dependency), and only when
    no single GPU of it stands out (``singles``: late on its overall median)
    but the one that starts last inside the host's own groups: a slow GPU's
    few ms per op add up, over an iteration, to its whole host (and pipeline
    replica) arriving late at the data-parallel sync, far above its own
    lateness (the share floor of ``rca_timing.score_timing``); that GPU is named.
    Timing is weaker evidence than a G/T/D symptom (a host behind a slow NIC
    arrives late too), so the score is bounded, and the representatives returned
    (the caller caps their confidence) are those named on the host's timing
    alone: a GPU late on its own median and last inside its host is not (a
    NIC does not slow one GPU inside its host's own groups). ``mem`` and
    ``spans``: ``Members(stats)`` and its spans, when the caller has them."""
    reps: set[int] = set()
    if late:
        intra = _intra_host_slowdown(ctx, Members(stats) if mem is None else mem, spans)
    else:
        intra = {}
    hosts = {ctx.topo.host_of(r) for r in late}
    for host in sorted(hosts):
        mates = ctx.topo.ranks_on_host(host)
        if len(mates) < PEERS or not all(m in late for m in mates):
            continue
        if intra.get(host, -1.0) <= 0:
            continue
        vals = [late[m] for m in mates]
        if min(vals) < 0.5 * max(vals):
            continue  # some ranks lead the host's lateness: not host-wide
        if any(
            c in suspects[m].scores
            for m in mates
            if m in suspects
            for c in (Component.NIC, Component.PROXY, Component.NETWORK)
        ):
            continue  # its own flows explain the lateness (G/T/D first)
        # Late in cross-host groups, the mates are alike; inside the host's
        # own groups (one clock) a single slow GPU still starts last.
        rep, lead = _host_leader(ctx, host, stats)
        if any(m in singles and m != rep for m in mates):
            continue  # another GPU stands out on its own median: not host-wide
        mean = float(np.mean([late[m] for m in mates]))
        why = (
            f"every rank of host {host} arrives late ({mean / 1e6:.1f} ms on "
            "average) and its intra-host collectives slowed: "
        )
        if rep is None:
            rep = max(mates, key=lambda m: (late[m], -m))
            why += "host-wide GPU load"
        else:
            why += (
                f"inside them rank {rep} starts last by {lead / 1e6:.1f} ms: "
                "its GPU holds the host back"
            )
        suspects.at(rep).add(
            Rule.HOST_WIDE_LATE,
            why,
            score=suspects.rca.timing_score(
                Rule.HOST_WIDE_LATE, mean, span, capped=True
            ),
        )
        if rep not in singles:
            reps.add(rep)
    return reps


HOST_LEAD_NS = 1_000_000
"""A rank leads its host when, over the host's own collectives, its median
late start exceeds every mate's by this much: same clock, so no offset
floor; well above the median of per-op compute jitter."""


def _host_leader(
    ctx: DetectContext, host: str, stats: Sequence[CollectiveStat]
) -> tuple[int | None, float]:
    """``(rank, lead ns)`` of the rank that starts last inside ``host``'s own
    collectives by at least ``HOST_LEAD_NS`` over the runner-up, else
    ``(None, 0)``."""
    # Raw lateness, not lateness against the rank's baseline: a slow GPU
    # whose lead sits just above the late floor is partly learned (samples
    # in band drag the median up), until its baseline holds the whole lead.
    # The ranks of one host's groups run the same work, so a lasting lead
    # among them is not structure.
    inside: dict[int, bool] = {}
    late: dict[int, list[float]] = {}
    for st in stats:
        if st.comm not in inside:
            ranks = st.ranks.tolist()
            inside[st.comm] = len(ranks) >= PEERS and all(
                ctx.topo.host_of(r) == host for r in ranks
            )
        if not inside[st.comm]:
            continue
        for r, v in zip(st.ranks.tolist(), st.lateness_ns().tolist(), strict=True):
            late.setdefault(r, []).append(v)
    if len(late) < PEERS:
        return None, 0.0
    med = {r: float(np.median(vals)) for r, vals in late.items()}
    first, second = sorted(med.items(), key=lambda kv: -kv[1])[:2]
    lead = first[1] - second[1]
    return (first[0], lead) if lead >= HOST_LEAD_NS else (None, 0.0)
