"""One collective as its members saw it, and blocks of them as columns.

``CollectiveStat`` holds a completed op's per-member times and what they
give (span, transfer, interval, lateness); ``Members`` reads a block of them
as flat member columns for detection and root cause, and ``pack_stats``
turns them into two arrays for a snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

import numpy as np

from mycroft.schemas.text import comm_hex


def small_median(values: np.ndarray) -> float:
    """``float(np.median(values))`` of a short 1-D array, without numpy's
    per-call overhead (ten times slower on the 2-32 members of a comm)."""
    ordered = sorted(values.tolist())
    n = len(ordered)
    if n == 0:
        return float("nan")
    mid = n // 2
    if n % 2:
        return float(ordered[mid])
    return (float(ordered[mid - 1]) + float(ordered[mid])) / 2


class CollectiveStat:
    """One collective completed by every member (times on host clocks, ns).

    Attributes:
        comm, seq, kind, nbytes: Identity of the op (kind: code of OP_NAMES).
        ranks: Members, in the order of the time arrays.
        issue_ns, start_ns, end_ns: Per-rank enqueue, first progress, completion.
        prev_issue_ns: Per-rank issue time of the previous op on this comm
            (-1 when unknown).
        first_issue_ns: Enqueue of the first member (host clock of that member).
        last_end_ns: Completion of the last member (host clock of that member).

    Read-only by convention. A slotted class, not a dataclass: a 1,024-rank
    job completes ~19,000 collectives a second, and a frozen dataclass's
    ``__init__`` and per-instance dictionary cost several times more than
    the op's own arithmetic (:func:`make_stats`, for the tracker's joins and
    for snapshots, fills the slots directly). ``_block`` holds rank, issue,
    start, end and previous issue of the op's members from ``_at`` on: the
    columns of every op of one join round (or snapshot), so that
    :class:`Members` and snapshots read a thousand ops with one gather, not
    one array each; ``_ops`` holds the round's op keys (:data:`OP_KEYS`),
    this op's at row ``_op``.
    """

    __slots__ = (
        "comm",
        "seq",
        "kind",
        "nbytes",
        "ranks",
        "issue_ns",
        "start_ns",
        "end_ns",
        "prev_issue_ns",
        "first_issue_ns",
        "last_end_ns",
        "_begin",
        "_span",
        "_block",
        "_at",
        "_ops",
        "_op",
    )

    def __init__(  # noqa: PLR0913, PLR0917 - the op's identity and its columns
        self,
        comm: int,
        seq: int,
        kind: int,
        nbytes: int,
        ranks: np.ndarray,
        issue_ns: np.ndarray,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
        prev_issue_ns: np.ndarray,
    ) -> None:
        self.comm, self.seq, self.kind, self.nbytes = comm, seq, kind, nbytes
        self.ranks, self.issue_ns = ranks, issue_ns
        self.start_ns, self.end_ns = start_ns, end_ns
        self.prev_issue_ns = prev_issue_ns
        self.first_issue_ns = int(issue_ns.min())
        self.last_end_ns = int(end_ns.max())
        self._begin: np.ndarray | None = None
        self._span: int | None = None
        self._block = np.stack(
            [ranks.astype(np.int64), issue_ns, start_ns, end_ns, prev_issue_ns]
        )
        self._at = 0
        self._ops = np.array([(comm, seq, kind, nbytes, len(ranks))], OP_KEYS)
        self._op = 0

    def __repr__(self) -> str:
        return (
            f"CollectiveStat(comm={comm_hex(self.comm)}, seq={self.seq}, "
            f"kind={self.kind}, "
            f"nbytes={self.nbytes}, ranks={self.ranks.tolist()})"
        )

    def snapshot_state(self) -> tuple[int, int, int, int, str, bytes]:
        """Snapshot state (worker snapshots) as one block of int64 columns: a
        snapshot holds thousands of these, and an array each costs more to
        encode than its data. Cached values are not kept."""
        cols = np.stack(
            [self.ranks.astype(np.int64), self.issue_ns, self.start_ns, self.end_ns]
            + [self.prev_issue_ns]
        ).astype(np.int64)
        return (
            self.comm,
            self.seq,
            self.kind,
            self.nbytes,
            self.ranks.dtype.str,
            cols.tobytes(),
        )

    def restore_state(self, state: tuple[int, int, int, int, str, bytes]) -> None:
        """Restore from :meth:`snapshot_state`."""
        comm, seq, kind, nbytes, rank_dtype, blob = state
        cols = np.frombuffer(blob, dtype=np.int64).reshape(5, -1).copy()
        self.__init__(  # type: ignore[misc]
            comm, seq, kind, nbytes, cols[0].astype(rank_dtype), *cols[1:]
        )

    @property
    def begin_ns(self) -> np.ndarray:
        """Per-rank kernel start (first progress), the issue time if unknown.

        The CPU enqueues ops ahead of the GPU (during the preceding compute),
        so the enqueue time says when the *CPU* got there; the first progress
        says when the rank itself arrived at the collective.
        """
        if self._begin is None:
            self._begin = np.where(self.start_ns > 0, self.start_ns, self.issue_ns)
        return self._begin

    @property
    def queued_span_ns(self) -> int:
        """First enqueue to last completion, queueing behind compute included."""
        return int(self.end_ns.max() - self.issue_ns.min())

    @property
    def span_ns(self) -> int:
        """First arrival (kernel start) to last completion: what the op cost."""
        if self._span is None:
            self._span = self.last_end_ns - int(self.begin_ns.min())
        return self._span

    @property
    def xfer_ns(self) -> int:
        """Shortest per-rank duration (own clock): the transfer once all arrived.

        The last rank to arrive waits for nobody, so its own start-to-end time
        is the communication itself; measured on one host clock it is free of
        clock offsets.
        """
        return int((self.end_ns - self.begin_ns).min())

    @property
    def interval_ns(self) -> int:
        """Median issue-to-issue time of the members (-1 when unknown)."""
        ok = self.prev_issue_ns >= 0
        if not ok.any():
            return -1
        return int(small_median(self.issue_ns[ok] - self.prev_issue_ns[ok]))

    def lateness_ns(self) -> np.ndarray:
        """Per-rank arrival (kernel start) minus the members' median arrival."""
        begin = self.begin_ns
        out: np.ndarray = begin - small_median(begin)
        return out

    def end_lag_ns(self) -> np.ndarray:
        """Per-rank completion minus the members' median completion."""
        out: np.ndarray = self.end_ns - small_median(self.end_ns)
        return out


OP_KEYS = np.dtype(
    [
        ("comm", "<u8"),
        ("seq", "<i8"),
        ("kind", "<i8"),
        ("nbytes", "<i8"),
        ("size", "<i8"),
    ]
)
"""One op's identity and how many members it has (:func:`op_keys`)."""


def op_keys(stats: Sequence[CollectiveStat]) -> np.ndarray:
    """One :data:`OP_KEYS` row per op of ``stats``, in order, read from the
    ops' shared key tables (one pass over the ops, not one per key)."""
    if not stats:
        return np.empty(0, OP_KEYS)
    tables, at = _shared(stats, _OPS, _OP)
    out: np.ndarray = np.concatenate(tables)[at]
    return out


_OPS, _OP = attrgetter("_ops"), attrgetter("_op")
_BLOCK, _AT = attrgetter("_block"), attrgetter("_at")


def _shared(
    stats: Sequence[CollectiveStat],
    table: Callable[[CollectiveStat], np.ndarray],
    offset: Callable[[CollectiveStat], int],
) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct tables the ops of ``stats`` point into (``table``: one
    per join round or snapshot), and each op's ``offset`` in its table as a
    position in the tables' concatenation along their last axis."""
    n = len(stats)
    held = list(map(table, stats))
    ident = np.fromiter(map(id, held), np.int64, n)
    at = np.fromiter(map(offset, stats), np.int64, n)
    _, first, which = np.unique(ident, return_index=True, return_inverse=True)
    tables = [held[i] for i in first.tolist()]
    base = np.cumsum([0] + [t.shape[-1] for t in tables[:-1]])
    return tables, base[which.ravel()] + at


class Members:
    """Every member of a block of collectives as flat columns (ops in block
    order, members in op order then member order), each op's keys (``comm``,
    ``kind``, ``nbytes``) and the per-op reductions over the members: the
    arithmetic of ``CollectiveStat`` for all ops at once."""

    def __init__(self, stats: Sequence[CollectiveStat]) -> None:
        keys = op_keys(stats)
        self.comm, self.kind, self.seq = keys["comm"], keys["kind"], keys["seq"]
        self.nbytes, self.size = keys["nbytes"], keys["size"]
        self.op = np.repeat(np.arange(len(stats)), self.size)
        self._at = np.r_[0, np.cumsum(self.size)[:-1]]
        self.rank, self.issue, start, self.end = _gather(stats, self.size, self._at)
        self.begin = np.where(start > 0, start, self.issue)  # as ``begin_ns``

    def ranks_of(self, op: int) -> np.ndarray:
        """The ranks of op ``op``, in member order."""
        at = int(self._at[op])
        out: np.ndarray = self.rank[at : at + int(self.size[op])]
        return out

    def per_op(self, ufunc: np.ufunc, values: np.ndarray) -> np.ndarray:
        """``ufunc`` reduced over each op's members (every op has one)."""
        out: np.ndarray = ufunc.reduceat(values, self._at)
        return out

    def span(self) -> np.ndarray:
        """Each op's ``span_ns``: first arrival to last completion."""
        out: np.ndarray = self.per_op(np.maximum, self.end) - self.per_op(
            np.minimum, self.begin
        )
        return out

    def off_median(self, values: np.ndarray) -> np.ndarray:
        """Each member's value minus the median of its op's (``lateness_ns``
        for ``begin``, ``end_lag_ns`` for ``end``).

        Ops have a handful of distinct member counts (a job's TP, PP and DP
        group sizes), so the medians are taken per count on an (ops x
        members) matrix: a row-wise median, not a sort of every member.
        """
        med = np.empty(len(self.size), np.float64)
        for n in np.unique(self.size).tolist():
            ops = self.size == n
            rows = values[ops[self.op]].reshape(-1, n)
            med[ops] = np.median(rows, axis=1)
        out: np.ndarray = values - med[self.op]
        return out


def _gather(
    stats: Sequence[CollectiveStat], size: np.ndarray, at: np.ndarray, rows: int = 4
) -> np.ndarray:
    """The first ``rows`` block rows (rank, issue, start, end, previous
    issue) of every member of ``stats``, as rows of one array, read from the
    ops' blocks.

    Concatenating one small array per op costs ~85 ms a column for the
    ~50,000 ops of a 1,024-rank window; the ops of one join round share a
    block, so this takes each distinct block once and gathers all members
    with one index.
    """
    if not len(stats):
        return np.zeros((rows, 0), np.int64)
    blocks, begin = _shared(stats, _BLOCK, _AT)
    index = np.repeat(begin - at, size) + np.arange(int(size.sum()))
    out: np.ndarray = np.concatenate([b[:rows] for b in blocks], axis=1)[:, index]
    return out


_OpKeys = tuple[list[int], list[int], list[int], list[int]]
"""Each op's comm, seq, kind and nbytes (:func:`make_stats`)."""


def pack_stats(stats: Sequence[CollectiveStat]) -> tuple[np.ndarray, np.ndarray]:
    """``stats`` as two arrays: one row per op (comm, seq, kind, nbytes,
    members) and the five member columns of every op (:func:`unpack_stats`
    inverts it). A snapshot holds thousands of ops; pickling each one's
    arrays costs ~30 us an op, these two a few ms in all."""
    ops = op_keys(stats)
    at = np.r_[0, np.cumsum(ops["size"])[:-1]]
    return ops, _gather(stats, ops["size"], at, rows=5)


def unpack_stats(ops: np.ndarray, block: np.ndarray) -> list[CollectiveStat]:
    """The ops of :func:`pack_stats`, sharing ``block`` (ranks as int32,
    the completion rows' type)."""
    size = ops["size"]
    at = np.r_[0, np.cumsum(size)[:-1]].astype(np.int64)
    return make_stats(
        (
            ops["comm"].tolist(),
            ops["seq"].tolist(),
            ops["kind"].tolist(),
            ops["nbytes"].tolist(),
        ),
        block[0].astype(np.int32),
        block,
        at,
        size,
    )


def make_stats(
    keys: _OpKeys,
    ranks: np.ndarray,
    block: np.ndarray,
    at: np.ndarray,
    count: np.ndarray,
) -> list[CollectiveStat]:
    """One :class:`CollectiveStat` per run of ``count`` members of ``block``
    (rows rank, issue, start, end, previous issue) from ``at`` on; ``keys``:
    the ops' comm, seq, kind and nbytes lists. ``CollectiveStat.__init__``'s
    work, with the reductions done for every op at once."""
    if not len(count):
        return []
    comm, seq, kind, size = keys
    ops = np.empty(len(count), OP_KEYS)
    ops["comm"], ops["seq"], ops["kind"] = comm, seq, kind
    ops["nbytes"], ops["size"] = size, count
    issue_ns, start_ns, end_ns, prev_issue = block[1], block[2], block[3], block[4]
    first_issue = np.minimum.reduceat(issue_ns, at).tolist()
    last_end = np.maximum.reduceat(end_ns, at).tolist()
    out = []
    bounds = zip(at.tolist(), (at + count).tolist(), strict=True)
    new = object.__new__
    for i, (lo, hi) in enumerate(bounds):
        stat = new(CollectiveStat)
        stat.comm, stat.seq, stat.kind, stat.nbytes = comm[i], seq[i], kind[i], size[i]
        stat.ranks, stat.issue_ns = ranks[lo:hi], issue_ns[lo:hi]
        stat.start_ns, stat.end_ns = start_ns[lo:hi], end_ns[lo:hi]
        stat.prev_issue_ns = prev_issue[lo:hi]
        stat.first_issue_ns, stat.last_end_ns = first_issue[i], last_end[i]
        stat._begin = stat._span = None
        stat._block, stat._at = block, lo
        stat._ops, stat._op = ops, i
        out.append(stat)
    return out
