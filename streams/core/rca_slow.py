"""Root cause of a slowdown: timing rules over completions, G/T/D over flows.

Per rank, against its own healthy baseline and its peers in the same window:

| evidence                                                   | component |
|------------------------------------------------------------|-----------|
| send flows keep a ready-not-sent gap (G>T), low T rate     | nic       |
| T frozen while G advances in a few long (>= 0.3 s) episodes| proxy     |
| transmitted-not-done lag (T>D) above peers                 | network   |
| issues ops late (late arrival) and finishes last           | gpu       |
| every rank of one host arrives late                        | gpu       |
| issues on time, gpu_ready lags peers, finishes last        | pcie      |

A rank that arrives *early* in some group (it waited there) is explained by
that group's late rank: this follows a slowdown across groups to its origin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from mycroft.schemas.records import Culprit, Evidence
from mycroft.schemas.vocab import SEND, Component, FaultKind
from mycroft.streams.core.baseline import size_bucket
from mycroft.streams.core.completions import CollectiveStat
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.rca_hang import Suspect, _rank

K = TypeVar("K")


@dataclass(frozen=True)
class FlowFeatures:
    """Per-flow statistics over the window (fractions of the flow's total)."""

    rank: int
    peer: int
    channel: int
    comm: int
    total: float
    gt_gap: float
    td_gap: float
    ready: float
    episodes: int
    longest_freeze_ns: int


def _flow_features(hist: np.ndarray) -> list[FlowFeatures]:
    send = hist[hist["dir"] == SEND]
    if not len(send):
        return []
    keys = np.stack(
        [
            send["rank"].astype(np.int64),
            send["peer"].astype(np.int64),
            send["channel"].astype(np.int64),
            send["comm"].view(np.int64),
        ],
        1,
    )
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.ravel()
    # One sort groups every flow's snapshots in tick order (no per-flow scan).
    order = np.lexsort((send["tick_ns"], inv))
    send, inv = send[order], inv[order]
    bounds = np.searchsorted(inv, np.arange(len(uniq) + 1))
    out = []
    for i, (rank, peer, ch, comm) in enumerate(uniq.tolist()):
        f = send[bounds[i] : bounds[i + 1]]
        tot = np.maximum(f["total"], 1).astype(np.float64)
        eps, longest = _freezes(f)
        out.append(
            FlowFeatures(
                rank,
                peer,
                ch,
                int(np.int64(comm).view(np.uint64)),
                total=float(np.median(tot)),
                gt_gap=float(np.mean((f["gpu_ready"] - f["transmitted"]) / tot)),
                td_gap=float(np.mean((f["transmitted"] - f["done"]) / tot)),
                ready=float(np.mean(f["gpu_ready"] / tot)),
                episodes=eps,
                longest_freeze_ns=longest,
            )
        )
    return out


def _freezes(f: np.ndarray) -> tuple[int, int]:
    """Count episodes where T stood still while G > T, and the longest (ns)."""
    same_op = (f["seq"][1:] == f["seq"][:-1]) & (f["comm"][1:] == f["comm"][:-1])
    stuck = (
        same_op
        & (f["transmitted"][1:] == f["transmitted"][:-1])
        & (f["gpu_ready"][1:] > f["transmitted"][1:])
    )
    eps, longest, run_start = 0, 0, -1
    ticks = f["tick_ns"]
    for i, st in enumerate(stuck.tolist()):
        if st and run_start < 0:
            run_start = i
        if (not st or i == len(stuck) - 1) and run_start >= 0:
            end = i + 1 if st else i
            dur = int(ticks[end] - ticks[run_start])
            if dur >= 300_000_000:
                eps += 1
                longest = max(longest, dur)
            run_start = -1
    return eps, longest


def _late_scores(
    ctx: DetectContext, stats: Sequence[CollectiveStat]
) -> tuple[dict[int, float], dict[int, float], set[int], dict[int, float]]:
    """Return per-rank late-arrival excess, last-finish excess (ns), waiters
    and the worst per-comm late excess.

    The first two are medians over every op of the rank (a rank late only
    where it waited on another group stays near zero). The last is
    aggregated per (comm, rank) first and the rank's worst comm is kept: a
    host whose ranks all run late is on time inside its own (intra-host)
    groups and late only in the groups that cross hosts, which the mixed
    median hides (used by the whole-host rule only).
    """
    late: dict[int, list[float]] = {}
    endl: dict[int, list[float]] = {}
    per_comm: dict[tuple[int, int], list[float]] = {}
    early: set[int] = set()
    # Waiting in a group means arriving early by a real margin: a fraction of
    # the op and at least the late floor (sub-ms jitter of a tiny collective
    # is no evidence of waiting on anyone).
    early_floor = ctx.cfg.late_floor_s * 1e9
    for st in stats:
        lt, el = st.lateness_ns(), st.end_lag_ns()
        span = max(float(st.span_ns), 1.0)
        early_cut = max(0.3 * span, early_floor)
        for r, lv, ev in zip(st.ranks.tolist(), lt.tolist(), el.tolist(), strict=True):
            base = ctx.book.find((st.comm, r, "late"))
            ref = base.stats()[0] if base is not None and base.warm else 0.0
            late.setdefault(r, []).append(lv - ref)
            per_comm.setdefault((st.comm, r), []).append(lv - ref)
            endl.setdefault(r, []).append(ev)
            if lv - ref < -early_cut:
                early.add(r)
    agg = {r: float(np.median(v)) for r, v in late.items()}
    agg_end = {r: float(np.median(v)) for r, v in endl.items()}
    worst: dict[int, float] = {}
    for (_, r), v in per_comm.items():
        med = float(np.median(v))
        worst[r] = max(worst.get(r, med), med)
    return agg, agg_end, early, worst


HOSTWIDE_CONF = 0.6
"""Highest confidence of a culprit named by the whole-host timing rule."""


def explain_slowdown(
    ctx: DetectContext, stats: Sequence[CollectiveStat], since_ns: int
) -> tuple[list[Culprit], list[Evidence]]:
    """Return culprits (best first) and evidence for a slowdown.

    Args:
        ctx: Detector context (baselines give each rank's healthy lateness).
        stats: Collectives completed since the onset, every comm.
        since_ns: Onset; flow snapshots from there on are examined.
    """
    suspects: dict[int, Suspect] = {}
    evidence: list[Evidence] = []
    flows = _flow_features(ctx.store.flow_history(since_ns))
    _score_flows(ctx, suspects, flows)
    _merge_nic_mates(ctx, suspects)
    late, end_lag, early, worst = _late_scores(ctx, stats)
    span = float(np.median([s.span_ns for s in stats])) if stats else 0.0
    floor = _late_floor(ctx, span)
    singles = {r for r in _outliers(late, floor) if r not in early}
    hostwide = _score_whole_hosts(
        ctx, suspects, _outliers(worst, floor), stats, span, singles=singles
    )
    _score_timing(ctx, suspects, late, end_lag, early, span, flows)
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
    ranked = _rank(ctx, suspects, FaultKind.SLOWDOWN)
    # A host-wide timing verdict is ambiguous (a host behind a slow NIC is
    # late as a whole too) until G/T/D evidence accumulates: its confidence
    # is capped so that a later flow-based culprit can revise it.
    ranked = [
        replace(c, confidence=min(c.confidence, HOSTWIDE_CONF))
        if c.rank in hostwide and c.component is Component.GPU
        else c
        for c in ranked
    ]
    return ranked, evidence


def _outliers(values: dict[K, float], floor: float) -> dict[K, float]:
    if len(values) < 2:
        return {}
    arr = np.array(list(values.values()))
    med = float(np.median(arr))
    mad = float(np.median(np.abs(arr - med))) * 1.4826
    cut = med + max(4 * mad, floor)
    return {r: v - med for r, v in values.items() if v > cut}


def _merge_nic_mates(ctx: DetectContext, suspects: dict[int, Suspect]) -> None:
    """GPUs sharing a NIC are one NIC: their link scores (nic / proxy /
    network) go to the mate with the strongest one instead of splitting the
    confidence between equally attached ranks."""
    link = (Component.NIC, Component.PROXY, Component.NETWORK)
    done: set[int] = set()
    for r in sorted(suspects):
        mates = [m for m in ctx.topo.ranks_on_nic(r) if m in suspects and m not in done]
        done.update(mates)
        with_link = [m for m in mates if any(c in suspects[m].scores for c in link)]
        if len(with_link) < 2:
            continue
        rep = max(
            with_link,
            key=lambda m: (max(suspects[m].scores.get(c, 0.0) for c in link), -m),
        )
        for m in with_link:
            if m == rep:
                continue
            sus = suspects[m]
            for c in link:
                if c in sus.scores:
                    suspects[rep].scores[c] = suspects[rep].scores.get(
                        c, 0.0
                    ) + sus.scores.pop(c)
            suspects[rep].reasons.extend(sus.reasons[:1])


def _score_flows(
    ctx: DetectContext, suspects: dict[int, Suspect], flows: list[FlowFeatures]
) -> None:
    # Flows are only comparable with flows of the same kind of communicator
    # (a PP send of a whole activation keeps a different G-T gap than a DP
    # ring step), so outliers are taken per communicator role.
    roles: dict[str, list[int]] = {}
    for i, f in enumerate(flows):
        info = ctx.topo.comms.get(f.comm)
        roles.setdefault(info.role if info else "other", []).append(i)
    for comp, attr, floor in (
        (Component.NIC, "gt_gap", 0.05),
        (Component.NETWORK, "td_gap", 0.05),
    ):
        found: dict[int, float] = {}
        for idx in roles.values():
            vals = {i: getattr(flows[i], attr) for i in idx}
            # Counters move in whole chunks: a gap of a chunk or two is
            # granularity, not a symptom (2 chunks of the role's median flow).
            chunks = 2.0 / max(float(np.median([flows[i].total for i in idx])), 1.0)
            found.update(_outliers(vals, max(floor, chunks)))
        for i, excess in found.items():
            f = flows[i]
            kind = comp
            if comp is Component.NIC and f.episodes and f.episodes <= 2:
                kind = Component.PROXY
            sus = suspects.setdefault(f.rank, Suspect(f.rank))
            prev = sus.scores.get(kind, 0.0)
            sus.add(
                kind,
                1.0 + 4 * excess,
                f"flow {f.rank}->{f.peer} ch {f.channel}: "
                f"{attr} {getattr(f, attr):.0%} vs peers, {f.episodes} freeze(s)",
            )
            if sus.flow is None or 1.0 + 4 * excess > prev:
                sus.flow = (f.peer, f.channel)


def _intra_host_slowdown(
    ctx: DetectContext, stats: Sequence[CollectiveStat]
) -> dict[str, float]:
    """Per host with intra-host collectives: +1 if their spans are slower than
    the other hosts' intra-host collectives of the same (op kind, size), else
    -1 (a peer comparison: a temporal baseline of sub-ms spans absorbs a
    slowdown below its absolute floor)."""
    per: dict[tuple[int, int], dict[str, list[float]]] = {}
    for st in stats:
        ranks = st.ranks.tolist()
        if len(ranks) < 2:
            continue
        host = ctx.topo.host_of(ranks[0])
        if any(ctx.topo.host_of(r) != host for r in ranks[1:]):
            continue
        key = (st.kind, size_bucket(st.nbytes))
        per.setdefault(key, {}).setdefault(host, []).append(float(st.span_ns))
    ratios: dict[str, list[float]] = {}
    for hosts in per.values():
        if len(hosts) < 3:
            continue
        meds = {h: float(np.median(v)) for h, v in hosts.items()}
        ref = max(float(np.median(list(meds.values()))), 1.0)
        for h, m in meds.items():
            ratios.setdefault(h, []).append(m / ref)
    agg = {h: float(np.median(v)) for h, v in ratios.items()}
    slow = _outliers(agg, 0.1)
    return {h: (1.0 if h in slow else -1.0) for h in agg}


def _score_whole_hosts(
    ctx: DetectContext,
    suspects: dict[int, Suspect],
    late: dict[int, float],
    stats: Sequence[CollectiveStat],
    span: float,
    *,
    singles: frozenset[int] | set[int] = frozenset(),
) -> set[int]:
    """Every rank of a host arrives late: one cause (a host-wide GPU load),
    not one suspect per rank splitting the confidence; one representative
    (its latest rank) carries the host's score. Only when the host's own
    intra-host collectives slowed too: a host late only in groups that cross
    hosts is waiting on another host (a pipeline dependency), and only when
    no single GPU of it stands out (``singles``: late on its overall median,
    i.e. the last to start inside its own groups too). Timing is
    weaker evidence than a G/T/D symptom (a host behind a slow NIC arrives
    late too), so the score is bounded."""
    reps: set[int] = set()
    intra = _intra_host_slowdown(ctx, stats) if late else {}
    hosts = {ctx.topo.host_of(r) for r in late}
    for host in sorted(hosts):
        mates = ctx.topo.ranks_on_host(host)
        if len(mates) < 2 or not all(m in late for m in mates):
            continue
        if intra.get(host, -1.0) <= 0:
            continue
        if any(m in singles for m in mates):
            continue  # one GPU is the last to start even inside its host
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
        rep = max(mates, key=lambda m: (late[m], -m))
        mean = float(np.mean([late[m] for m in mates]))
        suspects.setdefault(rep, Suspect(rep)).add(
            Component.GPU,
            1.5 + min(1.0, mean / max(span, 1.0)),
            f"every rank of host {host} arrives late ({mean / 1e6:.1f} ms on "
            "average) and its intra-host collectives slowed: host-wide GPU load",
        )
        reps.add(rep)
    return reps


def _late_floor(ctx: DetectContext, span: float) -> float:
    return max(ctx.cfg.late_floor_s * 1e9, 0.1 * span)


def _score_timing(  # noqa: PLR0917 - private helper of one module
    ctx: DetectContext,
    suspects: dict[int, Suspect],
    late: dict[int, float],
    end_lag: dict[int, float],
    early: set[int],
    span: float,
    flows: list[FlowFeatures],
) -> None:
    floor = _late_floor(ctx, span)
    late_out = {r: v for r, v in _outliers(late, floor).items() if r not in early}
    for r, excess in late_out.items():
        sus = suspects.setdefault(r, Suspect(r))
        mates = ctx.topo.ranks_on_host(ctx.topo.host_of(r))
        whole = len(mates) > 1 and all(m in late_out for m in mates)
        sus.add(
            Component.GPU,
            1.0 + excess / max(span, 1.0),
            f"arrives {excess / 1e6:.1f} ms late"
            + (" with every rank of its host" if whole else ""),
        )
    ready = {f.rank: f.ready for f in flows}
    deficit = {r: -v for r, v in ready.items()}
    for r, d in _outliers(deficit, 0.1).items():
        if r not in late_out:
            suspects.setdefault(r, Suspect(r)).add(
                Component.PCIE,
                1.0 + d,
                f"gpu_ready lags peers by {d:.0%} of the op "
                "while it issues on time (copies late)",
            )
    lag_out = _outliers(end_lag, floor)
    for r, excess in lag_out.items():
        if r in late_out or r in early:
            continue
        sus = suspects.setdefault(r, Suspect(r))
        others = [v for k, v in ready.items() if k != r]
        behind = r in ready and others and ready[r] < float(np.median(others)) - 0.05
        sus.add(
            Component.PCIE,
            0.8 + (0.4 if behind else 0.0) + excess / max(span, 1.0),
            f"issues on time but finishes {excess / 1e6:.1f} ms after the median"
            + ("; gpu_ready lags peers" if behind else ""),
        )
