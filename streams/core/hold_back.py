"""A rank that holds its group back: the time a collective waits on one
member alone, summed over a window of the comm's ops.

Lateness (``detect_slow``) judges each op's arrival against the rank's own
baseline and needs it out of band on ``late_persist`` of the rank's last
``late_of`` ops. A straggler that delays one op of every training step (a
slow layer's backward under FSDP2 or tensor parallelism: one op in four to
nine on its comm) is on time on the others: it never persists, and the
medians the root cause reads do not see it. What it costs the job is the
time the others wait on it, so that is what this module measures.

Per op of ``hold_min_members`` or more members, the member that arrived
last *alone* holds the others back by its lead over the next-latest. Only
the part beyond its usual lateness counts (the median of its lateness
baseline: a rank that is always a little late is structure, not a fault),
and only when it clears the op's late floor. Summed per holder over a
window of the comm's ops and divided by the window's elapsed time, it is
the share of the group's time lost to that rank alone; a share of at least
``hold_share_min`` built from ``hold_need`` or more ops, the latest of them
at the same place of successive steps (:func:`periodic`), is a slowdown.

Point-to-point pairs (pipeline send/recv) are left out: there a receiver
posts before its sender by an amount set by the op's place in the schedule
(1F1B warm-up, steady state, cool-down), which no per-rank median
describes; for the same reason their lateness fires only SEVERE
(``detect_slow``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mycroft.streams.core.collective_stat import Members
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.rows import group_ids, run_starts
from mycroft.streams.core.suspect import Suspects

HOLD_ROW = np.dtype(
    [
        ("comm", "<u8"),
        ("seq", "<i8"),
        ("op", "<i8"),  # index in the block; -1 for ops of earlier blocks
        ("begin", "<i8"),
        ("end", "<i8"),
        ("holder", "<i8"),  # -1: no member held the op back
        ("excess", "<f8"),
    ]
)
"""One op of a comm's hold window: its time span, who held it back, by how
much beyond that rank's usual lateness (ns)."""


@dataclass(frozen=True)
class Hold:
    """A rank whose holds over its comm's last ops reached the share."""

    op: int
    """Index in the block of the op that completed the window."""
    rank: int
    count: int
    """Ops of the window the rank held back."""
    held_ns: float
    """Time held beyond its usual lateness, summed over those ops."""
    share: float
    """``held_ns`` over the window's elapsed time."""


def op_holds(  # noqa: PLR0913, PLR0917 - columns of one block
    mem: Members,
    late: np.ndarray,
    usual: np.ndarray,
    floors: np.ndarray,
    cfg: DetectorConfig,
) -> np.ndarray:
    """One ``HOLD_ROW`` per op of ``mem`` with ``hold_min_members`` or more
    members, in block order.

    Per member row: ``late``, its lateness (``Members.off_median`` of
    ``begin``); ``usual``, its usual lateness (ns; NaN while its baseline
    warms up, which counts no hold). ``floors``: each op's late floor (ns).
    """
    big = np.flatnonzero(mem.size >= cfg.hold_min_members)
    out = np.zeros(len(big), HOLD_ROW)
    if not len(big):
        return out
    out["comm"], out["seq"], out["op"] = mem.comm[big], mem.seq[big], big
    out["begin"] = mem.per_op(np.minimum, mem.begin)[big]
    out["end"] = mem.per_op(np.maximum, mem.end)[big]
    out["holder"] = -1
    where = np.searchsorted(big, np.arange(len(mem.size)))
    for n in np.unique(mem.size[big]).tolist():
        ops = np.flatnonzero(mem.size == n)
        rows = np.isin(mem.op, ops)
        begin = mem.begin[rows].reshape(-1, n)
        order = np.argsort(begin, axis=1, kind="stable")
        at = np.arange(len(ops))
        last, second = order[:, -1], order[:, -2]
        lead = begin[at, last] - begin[at, second]
        beyond = (
            late[rows].reshape(-1, n)[at, last] - usual[rows].reshape(-1, n)[at, last]
        )
        excess = np.minimum(lead, np.nan_to_num(beyond, nan=0.0))
        counts = excess >= floors[ops]
        dest = where[ops]
        out["excess"][dest] = np.where(counts, excess, 0.0)
        out["holder"][dest] = np.where(
            counts, mem.rank[rows].reshape(-1, n)[at, last], -1
        )
    return out


def advance_holds(
    tail: np.ndarray, new: np.ndarray, cfg: DetectorConfig
) -> tuple[np.ndarray, list[Hold]]:
    """Append a block's ``new`` hold rows (completion order) to the comms'
    windows ``tail`` (each comm's last ``hold_of`` ops); return the new tail
    and the holds that reach ``hold_share_min`` with ``hold_need`` ops, one
    per held op of the block, in block order.

    The window of an op is its comm's last ``hold_of`` ops up to it, so the
    answer does not depend on how ops are split into blocks.
    """
    if not len(new):
        return tail, []
    involved = np.isin(tail["comm"], np.unique(new["comm"]))
    rows = np.concatenate([tail[involved], new])
    rows = rows[np.argsort(rows["comm"], kind="stable")]
    starts = run_starts(rows["comm"])
    index = np.arange(len(rows))
    first = np.maximum.accumulate(np.where(starts, index, 0))
    width = cfg.hold_of
    found: list[Hold] = []
    for j in np.flatnonzero((rows["op"] >= 0) & (rows["holder"] >= 0)).tolist():
        win = rows[max(int(first[j]), j - width + 1) : j + 1]
        mine = win["holder"] == rows["holder"][j]
        count = int(mine.sum())
        if count < cfg.hold_need or not periodic(win["seq"][mine], cfg.hold_need):
            continue
        held = float(win["excess"][mine].sum())
        elapsed = float(win["end"].max() - win["begin"].min())
        share = held / max(elapsed, 1.0)
        if share >= cfg.hold_share_min:
            found.append(
                Hold(
                    int(rows["op"][j]),
                    int(rows["holder"][j]),
                    count,
                    held,
                    share,
                )
            )
    keep = _last_of_groups(starts, width)
    kept = rows[keep]
    kept["op"] = -1
    found.sort(key=lambda h: (h.op, h.rank))
    return np.concatenate([tail[~involved], kept]), found


def periodic(seqs: np.ndarray, need: int) -> bool:
    """Whether the latest of ``seqs`` (ascending op numbers of one comm that
    one rank held back) and ``need - 1`` before it fall at the same place of
    successive steps, the rank on time somewhere in between: on a
    progression ``last - p, last - 2p, ...`` with ``p >= 2``, and not every
    op between ``last - p`` and ``last`` held.

    A straggler slows the same layer's collective in every step and is on
    time for the others; a rank a GC pause or the OS delays for a while
    holds a run of consecutive ops, and one slow on every op is the
    lateness rule's (``slow_late``).
    """
    if len(seqs) < need:
        return False
    held = {int(x) for x in seqs.tolist()}
    last = int(seqs[-1])
    for period in sorted({last - x for x in held if x < last - 1}):
        on_step = all(last - k * period in held for k in range(1, need))
        if on_step and any(last - j not in held for j in range(1, period)):
            return True
    return False


def _last_of_groups(starts: np.ndarray, width: int) -> np.ndarray:
    """Mask of the last ``width`` rows of each run that ``starts`` begins."""
    begins = np.flatnonzero(starts)
    lengths = np.diff(np.r_[begins, len(starts)])
    end_of_row = np.repeat(begins + lengths, lengths)
    keep: np.ndarray = np.arange(len(starts)) >= end_of_row - width
    return keep


def rank_holds(  # noqa: PLR0913, PLR0917 - columns of one block
    mem: Members,
    late: np.ndarray,
    usual: np.ndarray,
    floors: np.ndarray,
    cfg: DetectorConfig,
) -> dict[int, tuple[float, int]]:
    """Each rank's largest share of one comm's time (its ops in ``mem``, an
    incident's, first begin to last end) in which it held that comm's ops
    back, and how many ops it held there; only ranks that held
    ``hold_need`` or more ops of one comm."""
    rows = op_holds(mem, late, usual, floors, cfg)
    out: dict[int, tuple[float, int]] = {}
    held = rows[rows["holder"] >= 0]
    if not len(held):
        return out
    comms, first = group_ids(rows["comm"])
    order, starts = np.argsort(comms, kind="stable"), _starts(comms)
    spans = np.maximum.reduceat(rows["end"][order], starts) - np.minimum.reduceat(
        rows["begin"][order], starts
    )
    elapsed = dict(zip(rows["comm"][first].tolist(), spans.tolist(), strict=True))
    pair, pair_first = group_ids(held["comm"], held["holder"])
    count = np.bincount(pair)
    total = np.bincount(pair, weights=held["excess"])
    for p, j in enumerate(pair_first.tolist()):
        if count[p] < cfg.hold_need or not periodic(
            np.sort(held["seq"][pair == p]), cfg.hold_need
        ):
            continue
        comm, rank = int(held["comm"][j]), int(held["holder"][j])
        share = float(total[p]) / max(float(elapsed[comm]), 1.0)
        if share > out.get(rank, (0.0, 0))[0]:
            out[rank] = (share, int(count[p]))
    return out


def _starts(groups: np.ndarray) -> np.ndarray:
    """Where each group begins in ``groups`` sorted (groups numbered 0..n-1)."""
    out: np.ndarray = np.r_[0, np.cumsum(np.bincount(groups))[:-1]]
    return out


def score_holds(  # noqa: PLR0913, PLR0917 - the root cause's columns
    suspects: Suspects,
    mem: Members,
    usual: np.ndarray,
    floor: float,
    cfg: DetectorConfig,
    skip: set[int],
) -> set[int]:
    """Name the ranks that held a comm's ops back for ``hold_share_min`` of
    its time in an incident's ops ``mem`` (``HOLDS_BACK``, gpu: the rank
    computes longer before those ops), except ``skip`` (ranks that waited
    on others); return them."""
    late = mem.off_median(mem.begin)
    floors = np.full(len(mem.size), floor)
    named: set[int] = set()
    for rank, (share, count) in sorted(
        rank_holds(mem, late, usual, floors, cfg).items()
    ):
        if rank in skip or share < cfg.hold_share_min:
            continue
        named.add(rank)
        suspects.at(rank).add(
            Rule.HOLDS_BACK,
            f"alone held {count} ops of a group back, {share:.0%} of its time "
            "beyond its usual lateness",
            score=suspects.rca.plus(Rule.HOLDS_BACK, share),
        )
    return named
