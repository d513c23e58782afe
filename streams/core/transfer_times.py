"""Wire timing: which part do the slowed network transfers share.

Every completed op reports, per flow, the time its data spent on the
network: per step from posted to done (NCCL's ProxyStep ``SendWait`` to the
step's stop), summed (``completion.avsc``'s ``flow_wire_ns``). Unlike a
flow's first-to-last time, this leaves out every wait before the data is
posted: for the receiver's credit (a slow GPU downstream), for the GPU to
produce it (a ring waiting on its slowest neighbour, a TP group's sync). A
part that slows (a NIC's transmit or receive side, a GPU's PCIe path, a
host's uplink) stretches the wire time of the flows crossing it and leaves
the others as they were.

The model, in three steps, each over all flows at once:

1. Per sender-receiver pair, the median log wire time per chunk before the
   incident's onset (its own history, kept for the onset once read:
   :meth:`TransferTimes.before`) and after it; the pair's change is the
   difference. The job's median change, when it is a slowdown, is taken
   out: a slowdown of every pair (a slower phase, the whole job waiting on
   one rank) is nobody's link. A speedup is not: a job stalled elsewhere
   sends less at once and most pairs move data faster than before, which
   says nothing against the pairs whose time stayed as it was (2 GPUs per
   NIC, credit slots: a slow GPU's pairs read 2x slower net of such a
   speedup, 1.98x on their own).
2. A pair is *slowed* when its change exceeds ``log(transfer_slow_ratio)``,
   and, when ``k`` GPUs share the NIC at either end, ``log(k)``: mates
   sending at once split their NIC's bandwidth, so a fault elsewhere that
   moves their sends together stretches a pair's wire time up to ``k``-fold
   with no part at fault (2 GPUs per NIC, credit slots: 1.4-1.9x on pairs
   far from a proxy delay or a slow GPU).
3. Every candidate part (each rank's send and receive path, each NIC's
   transmit and receive side, each host's, and each of them both ways:
   ``Side``) is scored by a log-likelihood
   ratio: a pair through a faulty part is slowed with probability
   ``transfer_p_fault``, any other with ``transfer_p_noise``; each slowed
   pair through the part adds ``log(pf / pn)``, each unslowed one
   ``log((1 - pf) / (1 - pn))``. The best part is the culprit this evidence
   names; parts scoring alike are all named (the two ends of one cable cannot
   be told apart by its transfers), and so is the wider of two nested parts
   scoring alike (a rank alone on its NIC: NIC and PCIe path are the same
   transfers, and the NIC is the part ranks share).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import numpy as np

from mycroft.schemas.vocab import SEND
from mycroft.streams.core.rca_config import RcaConfig
from mycroft.streams.core.rows import group_counts_medians, run_starts

TIMES = np.dtype(
    [
        ("rank", "<i4"),
        ("peer", "<i4"),
        ("first_ns", "<i8"),
        ("last_ns", "<i8"),
        ("log_ns", "<f4"),  # log of the wire time per chunk, ns
    ]
)
"""One completed network send (one op, one peer): its pair, its span and
its time on the wire per chunk."""


class TransferTimes:
    """The latest timed network sends, as a ring of ``TIMES`` rows (one per
    op and peer, its channels merged).

    The ring holds ``per_rank`` rows for every rank that sent or received
    one, at least ``least``, and grows when a new rank shows up: a job's
    sends per second grow with its ranks, so a large job keeps about the
    seconds of history a small one does, the onset and the time before it.
    """

    def __init__(self, per_rank: int, least: int = 0) -> None:
        self.per_rank, self.least = per_rank, least
        self.ranks = np.zeros(0, dtype=np.int32)  # seen, ascending
        self.rows = np.zeros(0, dtype=TIMES)
        self.count = 0  # rows ever written; the ring holds the last ``len(rows)``
        self.onsets: dict[int, PairMedians] = {}  # :meth:`before`, by onset

    def add(self, op: np.ndarray, flow: np.ndarray) -> None:
        """Keep the timed network sends of a completion batch's ``op`` and
        ``flow`` rows (``DONE_OP_COLUMNS``, ``DONE_FLOW_COLUMNS``): one row
        per op and peer, its channels' wire times and chunks summed."""
        if not len(op) or not len(flow) or self.per_rank <= 0:
            return
        owner = np.repeat(np.arange(len(op)), op["nflows"])
        if len(owner) != len(flow):
            return  # the batch's checks reject it; nothing here to keep
        keep = (flow["dir"] == SEND) & (flow["wire_ns"] > 0) & (flow["chunks"] > 0)
        if not keep.any():
            return
        owner, fl = owner[keep], flow[keep]
        order = np.lexsort((fl["peer"], owner))
        owner, fl = owner[order], fl[order]
        peer = fl["peer"]
        starts = np.flatnonzero(run_starts(owner, peer))
        chunks = np.add.reduceat(fl["chunks"].astype(np.int64), starts)
        wire = np.add.reduceat(fl["wire_ns"], starts)
        new = np.zeros(len(starts), dtype=TIMES)
        new["rank"] = op["rank"][owner[starts]]
        new["peer"] = peer[starts]
        new["first_ns"] = np.minimum.reduceat(fl["first_ns"], starts)
        new["last_ns"] = np.maximum.reduceat(fl["last_ns"], starts)
        new["log_ns"] = np.log(wire / chunks)
        self._fit(np.concatenate((new["rank"], new["peer"])))
        self._write(new)

    def _fit(self, ranks: np.ndarray) -> None:
        """Grow the ring to ``per_rank`` rows for each rank seen."""
        if len(self.ranks):
            pos = np.minimum(np.searchsorted(self.ranks, ranks), len(self.ranks) - 1)
            if (self.ranks[pos] == ranks).all():
                return
        self.ranks = np.union1d(self.ranks, ranks).astype(np.int32)
        want = max(self.least, self.per_rank * len(self.ranks))
        if want <= len(self.rows):
            return
        held = self.kept()
        self.rows = np.zeros(want, dtype=TIMES)
        self.rows[: len(held)] = held
        self.count = len(held)

    def _write(self, new: np.ndarray) -> None:
        cap = len(self.rows)
        new = new[-cap:]
        at = (self.count + np.arange(len(new))) % cap
        self.rows[at] = new
        self.count += len(new)

    def kept(self) -> np.ndarray:
        """The rows held, oldest first."""
        cap = len(self.rows)
        if self.count <= cap:
            return self.rows[: self.count]
        at = self.count % cap
        return np.concatenate((self.rows[at:], self.rows[:at]))

    def before(self, since_ns: int) -> PairMedians:
        """Each pair's median log time per chunk over its sends ended before
        ``since_ns``, kept for that onset.

        The ring holds seconds of sends, and a verdict can form later than
        that (a switch congestion named 12 s after its onset); every pair's
        change is measured against its history before the onset, so the
        first reading of it is kept, and each later one keeps, per pair,
        whichever saw more sends (sends reordered across the onset still
        arrive after the first reading). The last ``ONSETS_KEPT`` onsets are
        kept.
        """
        rows = self.kept()
        now = PairMedians.of(rows[rows["last_ns"] < since_ns])
        held = self.onsets.pop(since_ns, None)
        if held is not None:
            now = held.merge(now)
        self.onsets[since_ns] = now
        while len(self.onsets) > ONSETS_KEPT:
            del self.onsets[next(iter(self.onsets))]
        return now


ONSETS_KEPT = 4
"""Onsets whose history :meth:`TransferTimes.before` keeps: a job explains
one slowdown at a time, and a few cover incidents that close and reopen."""


@dataclass(frozen=True)
class PairMedians:
    """Per sender-receiver pair (``rank << 32 | peer``, ascending): its
    sends counted and their median log time per chunk."""

    key: np.ndarray
    count: np.ndarray
    median: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray) -> PairMedians:
        """The pairs of ``rows`` (``TIMES``)."""
        key = (rows["rank"].astype(np.int64) << 32) | rows["peer"].astype(np.int64)
        return cls(*group_counts_medians(key, rows["log_ns"]))

    def merge(self, other: PairMedians) -> PairMedians:
        """Per pair, whichever of the two saw more sends (``self`` on ties)."""
        key = np.union1d(self.key, other.key)
        count = np.zeros(len(key), dtype=np.int64)
        median = np.zeros(len(key), dtype=np.float64)
        for side in (other, self):  # self last: it wins ties
            at = np.searchsorted(key, side.key)
            more = side.count >= count[at]
            count[at[more]] = side.count[more]
            median[at[more]] = side.median[more]
        return PairMedians(key, count, median)

    def least(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and medians of the pairs with at least ``n`` sends."""
        keep = self.count >= n
        return self.key[keep], self.median[keep]


@dataclass(frozen=True)
class PairChanges:
    """Per sender-receiver pair with times on both sides of the onset."""

    rank: np.ndarray
    peer: np.ndarray
    change: np.ndarray  # log slowdown, the job's median change taken out
    slowed: np.ndarray  # bool

    @cached_property
    def slowed_senders(self) -> frozenset[int]:
        """Ranks with a send slowed on the wire."""
        return frozenset(int(r) for r in self.rank[self.slowed])

    def cleared_ends(self, rank: int, peer: int, ratio: float) -> tuple[bool, bool]:
        """For the pair ``rank`` -> ``peer`` slowed on the wire: whether its
        sender sends to another rank, and whether its receiver receives from
        another, at under ``ratio`` times their own time before.

        That end's path (its NIC, its PCIe link, its proxy) moves data as
        before, so the pair's slowdown is not there. ``(False, False)`` when
        the pair is not slowed: the wire then says nothing of its ends.
        """
        this = (self.rank == rank) & (self.peer == peer)
        if not (self.slowed & this).any():
            return False, False
        clean = self.change < math.log(ratio)
        send = clean & (self.rank == rank) & (self.peer != peer)
        receive = clean & (self.peer == peer) & (self.rank != rank)
        return bool(send.any()), bool(receive.any())

    def across(self, host_of: np.ndarray) -> PairChanges:
        """The pairs between two hosts (``host_of``: a host id per rank, -1
        unknown): pairs within a host (NVLink, shared memory) cross no NIC."""
        return self.where(lookup(host_of, self.rank) != lookup(host_of, self.peer))

    def where(self, keep: np.ndarray) -> PairChanges:
        """The pairs where ``keep`` (a bool per pair) holds."""
        return PairChanges(
            self.rank[keep], self.peer[keep], self.change[keep], self.slowed[keep]
        )


PartKey = tuple[str, str, int]
"""A part as the wire check keys it: scope, side, id."""


@dataclass
class WireWatch:
    """What the wire check (``detect_wire``) remembers between checks: the
    last check's index (event time // period), and per part flagged in the
    checks just before, its onset and how many checks in a row."""

    last_check: int = -1
    streak: dict[PartKey, tuple[int, int]] = field(default_factory=dict)


NO_PAIRS = PairChanges(
    np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, bool)
)
"""The wire timing of a job whose producers do not time the wire."""


def pair_changes(
    rows: np.ndarray,
    since_ns: int,
    rca: RcaConfig,
    share: np.ndarray | None = None,
    before: PairMedians | None = None,
) -> PairChanges:
    """Each pair's change in time per chunk from before ``since_ns`` to after
    it (``rows``: ``TIMES``), net of the job's median slowdown; pairs in
    ascending (rank, peer) order.

    A pair counts with ``transfer_min_before`` transfers ended before the
    onset and ``transfer_min_after`` started after it. ``share``: per rank
    (index), the GPUs on its NIC (:func:`nic_share`); a pair is slowed beyond
    the larger of its two ends' (module docstring, step 2). ``before``: the
    history before the onset (:meth:`TransferTimes.before`), else read from
    ``rows``.
    """
    if before is None:
        before = PairMedians.of(rows[rows["last_ns"] < since_ns])
    b_key, b_med = before.least(rca.transfer_min_before)
    a_key, a_med = PairMedians.of(rows[rows["first_ns"] >= since_ns]).least(
        rca.transfer_min_after
    )
    both, ia, ib = np.intersect1d(a_key, b_key, assume_unique=True, return_indices=True)
    raw = a_med[ia] - b_med[ib]
    change = raw - max(float(np.median(raw)), 0.0) if len(raw) else raw
    rank, peer = both >> 32, both & 0xFFFFFFFF
    ratio = np.full(len(both), rca.transfer_slow_ratio)
    if share is not None:
        ends = np.maximum(lookup(share, rank, 1), lookup(share, peer, 1))
        ratio = np.maximum(ratio, ends)
    slowed = change >= np.log(ratio)
    return PairChanges(rank, peer, change, slowed)


def nic_share(nic_of: np.ndarray) -> np.ndarray:
    """Per rank, the ranks on its NIC (``nic_of``: a NIC id per rank, -1
    unknown, counted as alone)."""
    known = nic_of >= 0
    counts = np.bincount(nic_of[known]) if known.any() else np.zeros(0, np.int64)
    out: np.ndarray = np.ones(len(nic_of), dtype=np.int64)
    out[known] = counts[nic_of[known]]
    return out


class Side(StrEnum):
    """Which of a part's transfers are read: those it sends, those it
    receives, or both (a congested uplink or switch port, background traffic,
    a link trained down slow both directions; a capped transmit side, one)."""

    SEND = "send"
    RECV = "recv"
    BOTH = "both"


class Scope(StrEnum):
    """The part: one rank's path to its NIC, a NIC, or a host."""

    RANK = "rank"
    NIC = "nic"
    HOST = "host"


@dataclass(frozen=True)
class SlowPart:
    """A part the slowed transfers share, with its score.

    ``ranks``: the part's ranks that sent (``Side.SEND``) or received the
    slowed transfers through it, most slowed first.
    """

    scope: Scope
    side: Side
    key: int
    ranks: tuple[int, ...]
    slowed: int
    clean: int
    llr: float


def slow_parts(
    pairs: PairChanges,
    nic_of: np.ndarray,
    host_of: np.ndarray,
    rca: RcaConfig,
    stopped: Callable[[], frozenset[int]] = frozenset,
) -> list[SlowPart]:
    """The parts that best explain the slowed cross-host pairs (several when
    tied; empty when no part explains them better than chance).

    A part that explains two or more slowed pairs is preferred. Without one,
    a single slowed pair names the one part at its ends that its clean
    pairs leave (its sender sends to others as before, its receiver's NIC
    mates receive as before: the receiver's path), never one of several
    alike: its two ends, or a rank's path and the NIC it has alone, carry
    the same pair. A pair sent by a rank ``stopped()`` returns (one whose
    transport was seen standing still with data waiting; asked for only on
    that path) is not read alone: a sender that stops observes its in-flight
    sends done late, which stretches their wire time.

    ``nic_of`` and ``host_of`` give a job-wide NIC and host id per rank
    (index), -1 where unknown; pairs within a host (NVLink, shared memory)
    cross no NIC and are left out.
    """
    pairs = pairs.across(host_of)
    if not pairs.slowed.any():
        return []
    scored = _scored(pairs, nic_of, host_of, rca)
    several = [p for p in scored if p.slowed > 1]
    if several:
        return _widest(_one_side(_top(several)))
    stop = pairs.slowed & np.isin(pairs.rank, list(stopped()))
    if stop.any():
        scored = _scored(pairs.where(~stop), nic_of, host_of, rca)
    # One slowed pair has two ends, and a rank alone on its NIC shares its
    # pairs with that NIC: the pair names a part only when the pairs clean
    # at the other parts it crosses leave exactly one.
    top = _one_side(_top(scored))
    return top if len(top) == 1 else []


def alarm_parts(
    pairs: PairChanges,
    nic_of: np.ndarray,
    host_of: np.ndarray,
    rca: RcaConfig,
    alarm_llr: float,
) -> list[SlowPart]:
    """The parts of :func:`slow_parts` that raise the wire alarm: each
    explains two or more slowed pairs with a log-likelihood ratio of at least
    ``alarm_llr``. The wire check (``detect_wire``) and root cause's uplink
    reading (``rca_transfers.score_uplinks``) both read the wire this way."""
    parts = slow_parts(pairs, nic_of, host_of, rca)
    return [p for p in parts if p.slowed > 1 and p.llr >= alarm_llr]


def _scored(
    pairs: PairChanges, nic_of: np.ndarray, host_of: np.ndarray, rca: RcaConfig
) -> list[SlowPart]:
    """Every part a slowed pair crosses, read one way and both ways, with
    its log-likelihood ratio; those above 0."""
    gain = math.log(rca.transfer_p_fault / rca.transfer_p_noise)
    loss = math.log((1 - rca.transfer_p_fault) / (1 - rca.transfer_p_noise))
    scored: list[SlowPart] = []
    # Both directions: every pair once at each end (a cross-host pair never
    # has both ends on one part).
    both = PairChanges(
        np.concatenate((pairs.rank, pairs.peer)),
        np.concatenate((pairs.peer, pairs.rank)),
        np.concatenate((pairs.change, pairs.change)),
        np.concatenate((pairs.slowed, pairs.slowed)),
    )
    for scope, ids in ((Scope.RANK, None), (Scope.NIC, nic_of), (Scope.HOST, host_of)):
        for side, read, ends in (
            (Side.SEND, pairs, pairs.rank),
            (Side.RECV, pairs, pairs.peer),
            (Side.BOTH, both, both.rank),
        ):
            key = ends if ids is None else lookup(ids, ends)
            scored.extend(_score(scope, side, key, ends, read, gain=gain, loss=loss))
    return [p for p in scored if p.llr > 0]


def _top(scored: list[SlowPart]) -> list[SlowPart]:
    """The parts of ``scored`` with the highest log-likelihood ratio."""
    if not scored:
        return []
    best = max(p.llr for p in scored)
    return [p for p in scored if math.isclose(p.llr, best, rel_tol=1e-9)]


def _one_side(top: list[SlowPart]) -> list[SlowPart]:
    """Drop a part's both-ways reading where it ties its one-sided one: the
    part carries traffic one way only, and that side names it."""
    sided = {(p.scope, p.key) for p in top if p.side is not Side.BOTH}
    return [p for p in top if p.side is not Side.BOTH or (p.scope, p.key) not in sided]


def lookup(ids: np.ndarray, ranks: np.ndarray, missing: int = -1) -> np.ndarray:
    """``ids[ranks]``, ``missing`` for ranks outside it."""
    out = np.full(len(ranks), missing, dtype=np.int64)
    ok = (ranks >= 0) & (ranks < len(ids))
    out[ok] = ids[ranks[ok]]
    return out


def _score(  # noqa: PLR0913 - one part kind's columns
    scope: Scope,
    side: Side,
    key: np.ndarray,
    ends: np.ndarray,
    pairs: PairChanges,
    *,
    gain: float,
    loss: float,
) -> list[SlowPart]:
    out: list[SlowPart] = []
    for k in np.unique(key[pairs.slowed]):
        if k < 0:
            continue
        mine = key == k
        hit = mine & pairs.slowed
        n_slow, n_clean = int(hit.sum()), int((mine & ~pairs.slowed).sum())
        who, times = np.unique(ends[hit], return_counts=True)
        ranks = tuple(int(r) for r in who[np.lexsort((who, -times))])
        llr = n_slow * gain + n_clean * loss
        out.append(SlowPart(scope, side, int(k), ranks, n_slow, n_clean, llr))
    return out


def _widest(top: list[SlowPart]) -> list[SlowPart]:
    """Of tied parts whose slowed ranks one contains, keep the wider part."""
    order = list(Scope)
    keep: list[SlowPart] = []
    for p in sorted(top, key=lambda p: -order.index(p.scope)):
        if not any(q.side == p.side and set(p.ranks) <= set(q.ranks) for q in keep):
            keep.append(p)
    return keep
