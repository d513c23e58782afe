"""Per-flow statistics of the send snapshots since an incident's onset.

A 1,024-rank job keeps tens of thousands of send flows in the window, and the
slowdown root cause reads them on every refresh, so every statistic here is a
reduction over all flows at once (one sort, ``reduceat``/``bincount`` per
quantity), never a loop over flows. ``tests/unit/core/test_fast_paths.py``
holds them to the per-flow definitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mycroft.schemas.vocab import RECV, SEND

FREEZE_NS = 300_000_000
"""T standing still this long while G > T is a freeze (not a slow link)."""
CLOCK_SKEW_NS = 10_000_000
"""Hosts sample on their own clocks, a few ms apart: a receiver's snapshot
up to this much after a sender's may be of the same instant (a fast flow
moves several chunks in the skew)."""


@dataclass(frozen=True)
class FlowFeatures:
    """Per-flow statistics over the window.

    ``ready`` is the mean over every snapshot, as a fraction of the flow's
    total; ``gt_chunks`` and ``td_chunks`` are the worst op's median gap in
    chunks over the snapshots where the flow had started (something ready,
    not all done), G-T counting only the data the receiver had posted
    buffers for and not yet received (:func:`sent_and_posted`);
    ``started``: there was one. ``episodes`` counts the
    freezes (T still for ``FREEZE_NS`` or more while G > T within one op),
    ``longest_freeze_ns`` is the longest; ``freeze_seq`` and
    ``freeze_start_ns`` place it (-1 when none; the first of equals).
    ``wait_chunks`` is the worst op's median of the part of G-T the
    receiver had not surely posted buffers for (``G - posted``, from
    :func:`sent_and_posted`): data that
    waits on the receiver's credit (a slot it has not freed, or its kernel
    not started), not on the sender's transport. ``td_ops`` holds every
    op's T-D (the worst is ``td_chunks``). ``drain_steps`` and
    ``stall_steps`` count the steps between consecutive snapshots of one op
    after which data the receiver had posted buffers for waited (G-T net of
    its credit), T having moved or stood still over the step.
    """

    rank: int
    peer: int
    channel: int
    comm: int
    total: float
    ready: float
    episodes: int
    longest_freeze_ns: int
    gt_chunks: float = 0.0
    td_chunks: float = 0.0
    started: bool = False
    freeze_seq: int = -1
    freeze_start_ns: int = -1
    wait_chunks: float = 0.0
    td_ops: tuple[float, ...] = field(default=(), compare=False)
    drain_steps: int = 0
    stall_steps: int = 0

    @property
    def stopped(self) -> bool:
        """The flow's transport was seen standing still with data waiting:
        a long freeze, or a stop between snapshots."""
        return bool(self.episodes or self.stall_steps)


def flow_features(
    hist: np.ndarray,
    host: np.ndarray | None = None,
    reports: np.ndarray | None = None,
) -> list[FlowFeatures]:
    """Features of every send flow (rank, peer, channel, comm) in ``hist``
    (``FLAT_FLOW`` snapshots), in ascending key order.

    With ``host`` (a host id per rank, indexed by rank), a cross-host send
    flow's per-op gaps are those of its rank's cross-host sends in the op
    as a whole (the median over their channels and snapshots), the
    statistic the role's baseline learns from every completed op
    (``detect_slow.op_flow_gaps``): one channel's median is far more
    variable than the rank's, and under credits a busy channel holds one or
    two posted slots while an idle one holds none. ``reports`` (per rank,
    indexed by rank) says whose producer reports receive flows
    (:func:`sent_and_posted`; default: those with one in ``hist``).
    """
    send = hist[hist["dir"] == SEND]
    if not len(send):
        return []
    recv = hist[hist["dir"] == RECV]
    comm = send["comm"].view(np.int64)  # keys order as signed ints
    # One sort puts every flow's snapshots together, in tick order.
    send = send[
        np.lexsort((send["tick_ns"], comm, send["channel"], send["peer"], send["rank"]))
    ]
    flow, starts = _runs(send["rank"], send["peer"], send["channel"], send["comm"])
    n = len(starts)
    counts = np.diff(np.append(starts, len(flow)))
    first = send[starts]
    tot = np.maximum(send["total"], 1).astype(np.float64)
    total = _group_median(tot, flow, starts, counts)
    ready_share = np.add.reduceat(send["gpu_ready"] / tot, starts) / counts
    run = (send["gpu_ready"] > 0) & (send["done"] < send["total"])
    started = np.bincount(flow[run], minlength=n) > 0
    # G-T splits at the receiver's posted buffers: the part it had posted
    # buffers for waits on the sender's transport, the rest on the receiver.
    reporting = None if reports is None else reports[send["peer"]]
    sent, posted = sent_and_posted(send, recv, reporting)
    gap, wait = posted_gap(send, sent, posted)
    group, ngroup, pick = flow, n, None
    if host is not None:
        away = host[first["rank"]] != host[first["peer"]]
        # Cross-host flows of one (rank, comm) share a group; others their own.
        key = np.where(away, -1, np.arange(n))
        pick = _key_ids(first["rank"], first["comm"], key)
        group, ngroup = pick[flow], int(pick.max()) + 1
    gt = _worst_op(send[run], group[run], ngroup, gap[run])
    td, td_ops = _every_op(
        send[run], group[run], ngroup, _gap(send, "transmitted", "done")[run]
    )
    if pick is not None:
        gt, td = gt[pick], td[pick]
        td_ops = [td_ops[i] for i in pick.tolist()]
    waits = _worst_op(send[run], flow[run], n, wait[run])
    eps, longest, at = _freezes(send, flow, n)
    drain, stall = _drain_and_stall(send[run], flow[run], n, gap[run])
    seq_at = np.where(at >= 0, send["seq"][at], -1)
    tick_at = np.where(at >= 0, send["tick_ns"][at], -1)
    return [
        FlowFeatures(*row)
        for row in zip(
            first["rank"].tolist(),
            first["peer"].tolist(),
            first["channel"].tolist(),
            first["comm"].tolist(),
            total.tolist(),
            ready_share.tolist(),
            eps.tolist(),
            longest.tolist(),
            gt.tolist(),
            td.tolist(),
            started.tolist(),
            seq_at.tolist(),
            tick_at.tolist(),
            waits.tolist(),
            td_ops,
            drain.tolist(),
            stall.tolist(),
            strict=True,
        )
    ]


def _runs(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group ids of rows sorted by ``cols`` (a new id where any column
    changes) and the first row of each group."""
    change = np.zeros(len(cols[0]), dtype=bool)
    change[0] = True
    for c in cols:
        change[1:] |= c[1:] != c[:-1]
    return np.cumsum(change) - 1, np.flatnonzero(change)


def _group_median(
    values: np.ndarray, group: np.ndarray, starts: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Median of ``values`` per group (rows sorted by group), as np.median."""
    ordered = values[np.lexsort((values, group))]
    lo = ordered[starts + (counts - 1) // 2]
    hi = ordered[starts + counts // 2]
    out: np.ndarray = (lo + hi) / 2
    return out


def _gap(rows: np.ndarray, ahead: str, behind: str) -> np.ndarray:
    out: np.ndarray = (rows[ahead] - rows[behind]).astype(np.float64)
    return out


def _key_ids(*cols: np.ndarray) -> np.ndarray:
    """Dense ids of the rows' keys (equal rows of ``cols``, equal id)."""
    order = np.lexsort(cols[::-1])
    ids, _ = _runs(*(c[order] for c in cols))
    out = np.empty(len(order), dtype=np.int64)
    out[order] = ids
    return out


def sent_and_posted(
    send: np.ndarray, recv: np.ndarray, reporting: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per send snapshot: what it had sent (its T), and the buffers its
    receiver had posted for it by then (at least that much).

    Posted reads the receiver's recv flow of the same op and channel at its
    latest snapshot up to ``CLOCK_SKEW_NS`` after the send's: hosts sample
    a few ms apart, so that snapshot may be the later one, and G only grows
    within an op. Buffers posted after the sender's snapshot are at most
    the data that arrived after it (under credits a slot is posted again
    only once its data was received and used): the receiver's T beyond the
    sender's T is taken off its G. Without such a snapshot, posted is what
    was sent if the receiver reports receive flows (it had not issued the
    op, or its buffers are not known to be posted yet), else ``inf`` (a
    producer that reports no receive flows: unknown counts as posted).
    Whether it does is ``reporting`` (per send row) where given, else
    whether ``recv`` holds any of its receive flows.
    """
    if reporting is None:
        reporting = np.isin(send["peer"], recv["rank"])
    out = np.where(reporting, 0.0, np.inf)
    sent = send["transmitted"].astype(np.float64)
    if not len(recv):
        return sent, np.maximum(out, sent)
    both = np.concatenate([send, recv])
    sender = np.concatenate([send["rank"], recv["peer"]])
    receiver = np.concatenate([send["peer"], recv["rank"]])
    ns = len(send)
    # The same key on both ends: sender, receiver, channel, comm, seq.
    key = _key_ids(sender, receiver, both["channel"], both["comm"], both["seq"])
    ticks, tinv = np.unique(both["tick_ns"], return_inverse=True)
    width = len(ticks) + 1
    r_all = key[ns:].astype(np.int64) * width + tinv[ns:]
    order = np.argsort(r_all, kind="stable")
    r_comp, r_g, r_t = (
        r_all[order],
        recv["gpu_ready"][order],
        recv["transmitted"][order],
    )
    # The receiver's latest snapshot up to the skew after each send's.
    upto = np.searchsorted(ticks, send["tick_ns"] + CLOCK_SKEW_NS, side="right") - 1
    s_key = key[:ns].astype(np.int64)
    at = np.searchsorted(r_comp, s_key * width + upto, side="right") - 1
    found = (at >= 0) & (r_comp[np.maximum(at, 0)] // width == s_key)
    at = at[found]
    # Data it had received beyond what the sender had sent arrived after
    # the sender's snapshot; each chunk of it freed at most one slot.
    after = np.maximum(r_t[at] - sent[found], 0.0)
    out[found] = r_g[at] - after
    return sent, np.maximum(out, sent)


def posted_gap(
    send: np.ndarray, sent: np.ndarray, posted: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per send snapshot, its ready-not-sent backlog (chunks) split at the
    receiver's posted buffers (:func:`sent_and_posted`): the part the
    receiver had posted buffers for, which waits on the sender's transport,
    and the part that waits on the receiver's credit.

    G - T splits chunk by chunk. The chunks a head step's ready-wait since
    the flow's previous snapshot stands for (``rw_chunks``,
    ``progress.held_ready``; a producer whose send G is at most T + 1) are
    the transport's when the receiver had posted a buffer beyond what was
    sent both at that previous snapshot and at this one, so the head
    waited with somewhere to go; otherwise the receiver's credit (an
    ``isend`` over InfiniBand waits for the receiver's buffer; a credit
    that arrived within the interval, or within the hosts' clock skew of
    its end, leaves the wait before it the credit's).
    """
    ready = send["gpu_ready"].astype(np.float64)
    credit = np.maximum(ready - posted, 0.0)
    gap = np.maximum(ready - sent - credit, 0.0)
    rw = send["rw_chunks"].astype(np.float64)
    if not rw.any():
        return gap, credit
    buffered = posted > sent
    before = buffered.copy()
    order = np.lexsort(
        (
            send["tick_ns"],
            send["seq"],
            send["comm"],
            send["channel"],
            send["peer"],
            send["rank"],
        )
    )
    key = send[["rank", "peer", "channel", "comm", "seq"]][order]
    same = key[1:] == key[:-1]
    before[order[1:][same]] = buffered[order[:-1][same]]
    transport = buffered & before
    gap = np.maximum(gap, np.where(transport, rw, 0.0))
    credit = np.maximum(credit, np.where(transport, 0.0, rw))
    return gap, credit


def _op_medians(
    run: np.ndarray, group: np.ndarray, gaps: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (group, op)'s median of ``gaps`` (one per row of ``run``), in
    group then seq order; the groups that have ops, and where each group's
    medians begin."""
    order = np.lexsort((run["seq"], group))
    ids, heads = _runs(group[order], run["seq"][order])
    counts = np.diff(np.append(heads, len(ids)))
    medians = _group_median(gaps[order], ids, heads, counts)
    op_group = group[order][heads]
    firsts = np.flatnonzero(np.diff(op_group, prepend=-1))
    return op_group[firsts], firsts, medians


def _worst_op(
    run: np.ndarray, group: np.ndarray, n: int, gaps: np.ndarray
) -> np.ndarray:
    """Per group, the largest per-op median of ``gaps`` (one per row of
    ``run``, over the group's started snapshots; 0 without one).

    A link that fails now and then (a flap) hits some ops only, which a
    statistic over the whole window would dilute. The median per op is what
    the role's baseline learns from each completed op
    (``detect_slow.op_flow_gaps``): a per-op mean is pulled up by the one or
    two snapshots of an op taken while a burst was staged, and the worst of
    many such means left the band on healthy flows."""
    out = np.zeros(n)
    if len(run):
        owners, firsts, medians = _op_medians(run, group, gaps)
        out[owners] = np.maximum.reduceat(medians, firsts)
    return out


def _every_op(
    run: np.ndarray, group: np.ndarray, n: int, gaps: np.ndarray
) -> tuple[np.ndarray, list[tuple[float, ...]]]:
    """:func:`_worst_op` and, per group, every op's median in seq order."""
    out = np.zeros(n)
    every: list[tuple[float, ...]] = [()] * n
    if not len(run):
        return out, every
    owners, firsts, medians = _op_medians(run, group, gaps)
    out[owners] = np.maximum.reduceat(medians, firsts)
    for g, part in zip(owners.tolist(), np.split(medians, firsts[1:]), strict=True):
        every[g] = tuple(part.tolist())
    return out, every


def _freezes(
    send: np.ndarray, flow: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per flow: freeze episodes, the longest (ns) and the snapshot index
    (into ``send``) where the longest began (-1 when none).

    A step between consecutive snapshots of one flow and one op is stuck
    when T did not move and G > T after it; a run of stuck steps from
    snapshot ``a`` to ``b`` lasts ``tick[b] - tick[a]``.
    """
    eps = np.zeros(n, dtype=np.int64)
    longest = np.zeros(n, dtype=np.int64)
    at = np.full(n, -1, dtype=np.int64)
    t, g = send["transmitted"], send["gpu_ready"]
    stuck = _same_op_steps(send, flow) & (t[1:] == t[:-1]) & (g[1:] > t[1:])
    first, dur = _step_runs(stuck, send["tick_ns"])
    keep = dur >= FREEZE_NS
    first, dur = first[keep], dur[keep]
    owner = flow[first]
    eps += np.bincount(owner, minlength=n)
    # The longest per flow; among equals the earliest (runs are in order).
    best = np.lexsort((first, -dur, owner))
    lead = best[np.flatnonzero(np.diff(owner[best], prepend=-1))]
    longest[owner[lead]] = dur[lead]
    at[owner[lead]] = first[lead]
    return eps, longest, at


def _same_op_steps(send: np.ndarray, flow: np.ndarray) -> np.ndarray:
    """Per step ``i`` (joining snapshots ``i`` and ``i + 1``): both are of
    one flow and one op."""
    same: np.ndarray = (
        (flow[1:] == flow[:-1])
        & (send["seq"][1:] == send["seq"][:-1])
        & (send["comm"][1:] == send["comm"][:-1])
    )
    return same


def _step_runs(steps: np.ndarray, ticks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First step and duration (ns) of every run of consecutive ``steps``; a
    run of steps ``a .. b - 1`` lasts ``ticks[b] - ticks[a]``."""
    edge = np.diff(np.concatenate([[0], steps.astype(np.int8), [0]]))
    first, last = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)
    return first, ticks[last] - ticks[first]


def _drain_and_stall(
    send: np.ndarray, flow: np.ndarray, n: int, gap: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per flow: steps after which ``gap`` (posted data not sent) was left,
    T having moved over the step (a transport draining) or not (stopped)."""
    t = send["transmitted"]
    held = _same_op_steps(send, flow) & (gap[1:] > 0)
    moved = t[1:] > t[:-1]
    owner = flow[1:]
    return (
        np.bincount(owner[held & moved], minlength=n),
        np.bincount(owner[held & ~moved], minlength=n),
    )
