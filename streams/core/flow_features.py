"""Per-flow statistics of the send snapshots since an incident's onset.

A 1,024-rank job keeps tens of thousands of send flows in the window, and the
slowdown root cause reads them on every refresh, so every statistic here is a
reduction over all flows at once (one sort, ``reduceat``/``bincount`` per
quantity), never a loop over flows. ``tests/unit/core/test_fast_paths.py``
holds them to the per-flow definitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mycroft.schemas.vocab import SEND

FREEZE_NS = 300_000_000
"""T standing still this long while G > T is a freeze (not a slow link)."""


@dataclass(frozen=True)
class FlowFeatures:
    """Per-flow statistics over the window.

    ``ready`` is the mean over every snapshot, as a fraction of the flow's
    total; ``gt_chunks`` and ``td_chunks`` are the worst op's median gap in
    chunks over the snapshots where the flow had started (something ready,
    not all done); ``started``: there was one. ``episodes`` counts the
    freezes (T still for ``FREEZE_NS`` or more while G > T within one op),
    ``longest_freeze_ns`` is the longest; ``freeze_seq`` and
    ``freeze_start_ns`` place it (-1 when none; the first of equals).
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


def flow_features(hist: np.ndarray) -> list[FlowFeatures]:
    """Features of every send flow (rank, peer, channel, comm) in ``hist``
    (``FLAT_FLOW`` snapshots), in ascending key order."""
    send = hist[hist["dir"] == SEND]
    if not len(send):
        return []
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
    ready = np.add.reduceat(send["gpu_ready"] / tot, starts) / counts
    run = (send["gpu_ready"] > 0) & (send["done"] < send["total"])
    started = np.bincount(flow[run], minlength=n) > 0
    gt = _worst_op(send[run], flow[run], n, "gpu_ready", "transmitted")
    td = _worst_op(send[run], flow[run], n, "transmitted", "done")
    eps, longest, at = _freezes(send, flow, n)
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
            ready.tolist(),
            eps.tolist(),
            longest.tolist(),
            gt.tolist(),
            td.tolist(),
            started.tolist(),
            seq_at.tolist(),
            tick_at.tolist(),
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


def _worst_op(
    run: np.ndarray, flow: np.ndarray, n: int, ahead: str, behind: str
) -> np.ndarray:
    """Per flow, the largest per-op median of ``ahead - behind`` over its
    started snapshots (0 without one): a link that fails now and then (a
    flap) hits some ops only, which a statistic over the whole window would
    dilute. The median per op is what the role's baseline learns from each
    completed op (``detect_slow.op_flow_gaps``): a per-op mean is pulled up
    by the one or two snapshots of an op taken while a burst was staged, and
    the worst of many such means left the band on healthy flows."""
    out = np.zeros(n)
    if not len(run):
        return out
    order = np.lexsort((run["seq"], flow))
    ids, heads = _runs(flow[order], run["seq"][order])
    gap = (run[ahead] - run[behind]).astype(np.float64)[order]
    counts = np.diff(np.append(heads, len(ids)))
    medians = _group_median(gap, ids, heads, counts)
    op_flow = flow[order][heads]
    firsts = np.flatnonzero(np.diff(op_flow, prepend=-1))
    out[op_flow[firsts]] = np.maximum.reduceat(medians, firsts)
    return out


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
    stuck = (
        (flow[1:] == flow[:-1])
        & (send["seq"][1:] == send["seq"][:-1])
        & (send["comm"][1:] == send["comm"][:-1])
        & (t[1:] == t[:-1])
        & (g[1:] > t[1:])
    )
    if not stuck.any():
        return eps, longest, at
    edge = np.diff(np.concatenate([[0], stuck.astype(np.int8), [0]]))
    first, last = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)
    ticks = send["tick_ns"]
    dur = ticks[last] - ticks[first]  # step i joins snapshots i and i + 1
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
