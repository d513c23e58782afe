"""Cross-rank view of completed collectives: who arrived late, who finished last."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from itertools import chain

import numpy as np

from mycroft.schemas.columns import DONE_OP_COLUMNS, empty
from mycroft.schemas.records import CompletionBatch
from mycroft.schemas.text import comm_hex
from mycroft.schemas.vocab import OP_NAMES
from mycroft.streams.core.rows import run_starts, stack_rows

_SEND, _RECV = OP_NAMES.index("send"), OP_NAMES.index("recv")


def matching_kind(kind: np.ndarray) -> np.ndarray:
    """Return op kind codes as they must agree across one ``(comm, seq)``.

    A point-to-point transfer is one op seen from two sides: one rank reports
    ``send``, its peer ``recv`` at the same seq. Both map to ``send`` so that
    the pair agrees; every other kind maps to itself.
    """
    out: np.ndarray = np.where(kind == _RECV, _SEND, kind).astype(kind.dtype)
    return out


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
    the op's own arithmetic (:meth:`CompletionTracker.join` fills the slots
    directly). ``_block`` holds rank, issue, start, end and previous issue
    of the op's members from ``_at`` on: the columns of every op of one join
    round (or snapshot), so that :class:`Members` and snapshots read a
    thousand ops with one gather, not one array each.
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

    def __repr__(self) -> str:
        return (
            f"CollectiveStat(comm={comm_hex(self.comm)}, seq={self.seq}, "
            f"kind={self.kind}, "
            f"nbytes={self.nbytes}, ranks={self.ranks.tolist()})"
        )

    def __getstate__(self) -> tuple[int, int, int, int, str, bytes]:
        """Pickle (worker snapshots) as one block of int64 columns: a snapshot
        holds thousands of these, and a numpy array each costs more to pickle
        than its data. Cached values are not kept."""
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

    def __setstate__(self, state: tuple[int, int, int, int, str, bytes]) -> None:
        """Restore from :meth:`__getstate__`."""
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
    """One :data:`OP_KEYS` row per op of ``stats``, in order."""
    n = len(stats)
    out = np.empty(n, OP_KEYS)
    out["comm"] = np.fromiter((s.comm for s in stats), np.uint64, n)
    out["seq"] = np.fromiter((s.seq for s in stats), np.int64, n)
    out["kind"] = np.fromiter((s.kind for s in stats), np.int64, n)
    out["nbytes"] = np.fromiter((s.nbytes for s in stats), np.int64, n)
    out["size"] = np.fromiter((len(s.ranks) for s in stats), np.int64, n)
    return out


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
    n = len(stats)
    if not n:
        return np.zeros((rows, 0), np.int64)
    ident = np.fromiter((id(s._block) for s in stats), np.int64, n)
    offset = np.fromiter((s._at for s in stats), np.int64, n)
    _, first, which = np.unique(ident, return_index=True, return_inverse=True)
    blocks = [stats[i]._block for i in first.tolist()]
    base = np.cumsum([0] + [b.shape[1] for b in blocks[:-1]])
    begin = base[which] + offset
    index = np.repeat(begin - at, size) + np.arange(int(size.sum()))
    out: np.ndarray = np.concatenate([b[:rows] for b in blocks], axis=1)[:, index]
    return out


_OpKeys = tuple[list[int], list[int], list[int], list[int]]
"""Each op's comm, seq, kind and nbytes (:func:`_make_stats`)."""


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
    return _make_stats(
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


def _make_stats(
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
        out.append(stat)
    return out


MAX_PARTIAL_ROWS = 200_000
"""Most rows of partial collectives a tracker holds. A 1,024-rank job has
~20,000 (each in-flight op's members, until the last reports); a job whose
communicator sizes never arrived (no topology record) would otherwise hold
every completion for ``completion_timeout_s``, tens of MB in its snapshot."""


class CompletionTracker:
    """Joins per-rank completions into collectives, a block of batches at a time.

    Batches are only queued on arrival (:meth:`add`); :meth:`join` sorts the
    queued rows together with the partial collectives left from earlier
    joins by ``(comm, seq, rank)`` and cuts out every collective whose
    members have all reported, with numpy over all rows at once. A 1,024-rank
    job completes ~19,000 collectives a second from ~1,300 host batches: a
    dictionary entry per (collective, batch) was most of its ingest cost.
    The result is the same as joining batch by batch: collectives come in
    the order the batch completing them arrived, and within one batch by
    unsigned ``(comm, seq)``; a rank reporting an op twice keeps its first row.
    """

    def __init__(self) -> None:
        self._queue: list[tuple[np.ndarray, int]] = []
        self.queued_rows = 0
        self._batches = 0
        # Partial collectives: rows sorted by (comm, seq, rank), with each
        # row's arrival (caller's clock) and arrival batch number.
        self._rows: np.ndarray | None = None
        self._at = np.zeros(0, np.int64)
        self._batch = np.zeros(0, np.int64)
        # Issue time of each (comm, rank)'s newest completed op, by sorted
        # key (comm code << 32 | rank); the last key is a sentinel above all.
        self._comm_code: dict[int, int] = {}
        self._prev_keys = np.array([np.iinfo(np.int64).max], np.int64)
        self._prev_times = np.array([-1], np.int64)
        self._odd: list[np.ndarray] = []  # rows of completed ops that disagree

    def add(self, batch: CompletionBatch, now_ns: int) -> None:
        """Queue one host's completions (``now_ns``: caller's clock)."""
        if len(batch.op):
            self._queue.append((batch.op, now_ns))
            self.queued_rows += len(batch.op)

    def ingest(
        self, batch: CompletionBatch, members: dict[int, int], now_ns: int
    ) -> list[CollectiveStat]:
        """:meth:`add` one batch and :meth:`join`; return the collectives."""
        self.add(batch, now_ns)
        return [stat for stat, _ in self.join(members)]

    def join(self, members: dict[int, int]) -> list[tuple[CollectiveStat, int]]:
        """Return ``(collective, arrival of the batch that completed it)`` for
        every collective the queued batches complete, in completion order.

        Args:
            members: ``comm -> nranks`` for comms whose size is known; a
                collective of another comm stays partial.
        """
        if not self._queue:
            return []
        rows, at, batch = self._queued_rows()
        comm, seq = rows["comm"].astype(np.uint64), rows["seq"].astype(np.uint64)
        order = np.lexsort((batch, rows["rank"], seq, comm))
        rows = rows[order]
        at, batch, comm, seq = (a[order] for a in (at, batch, comm, seq))
        rank = rows["rank"]
        new_key = run_starts(comm, seq)
        first = run_starts(comm, seq, rank)
        if not first.all():  # a rank reported an op twice: keep its first row
            rows = rows[first]
            at, batch, comm, seq = (a[first] for a in (at, batch, comm, seq))
            new_key = new_key[first]
        starts = np.flatnonzero(new_key)
        count = np.diff(np.r_[starts, len(rows)])
        comms, of_op = np.unique(comm[starts], return_inverse=True)
        sizes = [members.get(c, 0) for c in comms.tolist()]
        need = np.array(sizes, np.int64)[of_op.ravel()]
        done = (need > 0) & (count >= need)
        done_rows = np.repeat(done, count)
        keep = ~done_rows
        self._rows, self._at, self._batch = rows[keep], at[keep], batch[keep]
        if not done.any():
            return []
        ends = np.maximum.reduceat(batch, starts)[done]
        arrived = np.maximum.reduceat(at, starts)[done]
        when = np.lexsort((seq[starts][done], comm[starts][done], ends))
        stats = self._build(rows[done_rows], count[done])
        return [(stats[i], int(arrived[i])) for i in when.tolist()]

    def _queued_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the partial rows followed by the queued ones, each with its
        arrival time and batch number; empty the queue."""
        parts, at, batch = [], [self._at], [self._batch]
        if self._rows is not None:
            parts.append(self._rows)
        for op, now_ns in self._queue:
            parts.append(op)
            at.append(np.full(len(op), now_ns, np.int64))
            batch.append(np.full(len(op), self._batches, np.int64))
            self._batches += 1
        self._queue, self.queued_rows = [], 0
        return stack_rows(parts), np.concatenate(at), np.concatenate(batch)

    def _build(self, rows: np.ndarray, count: np.ndarray) -> list[CollectiveStat]:
        """Make one :class:`CollectiveStat` per run of ``count`` rows (sorted
        by comm, seq, rank: one row per member), in that order."""
        at = np.r_[0, np.cumsum(count)[:-1]]
        cols = [
            np.ascontiguousarray(rows[f])
            for f in ("rank", "issue_ns", "start_ns", "end_ns", "comm", "seq")
        ]
        kinds, nbytes = matching_kind(rows["kind"]), rows["bytes"]
        one_kind = np.minimum.reduceat(kinds, at) == np.maximum.reduceat(kinds, at)
        one_size = np.minimum.reduceat(nbytes, at) == np.maximum.reduceat(nbytes, at)
        agree = one_kind & one_size
        if not agree.all():
            self._keep_odd(rows[np.repeat(~agree, count)])
        prev_issue = self._prev_issue(cols[4], cols[5], cols[0], cols[1])
        block = np.stack([cols[0].astype(np.int64), *cols[1:4], prev_issue])
        kind, size = kinds[at].tolist(), nbytes[at].tolist()
        for i in np.flatnonzero(~agree).tolist():
            lo, hi = int(at[i]), int(at[i] + count[i])
            if not one_kind[i]:
                kind[i] = _majority(kinds[lo:hi])
            if not one_size[i]:
                size[i] = int(small_median(nbytes[lo:hi]))
        keys = (cols[4][at].tolist(), cols[5][at].tolist(), kind, size)
        return _make_stats(keys, cols[0], block, at, count)

    def _keep_odd(self, rows: np.ndarray, keep_rows: int = 4096) -> None:
        """Keep the rows of completed collectives whose members disagree on
        kind or size (the newest ``keep_rows``) for :meth:`signature_rows`."""
        self._odd.append(rows)
        while sum(len(r) for r in self._odd) - len(self._odd[0]) >= keep_rows:
            self._odd.pop(0)

    def signature_rows(self) -> np.ndarray:
        """Return the completion rows a mismatch is judged on: those of every
        partial collective and of recent completed ones that disagree."""
        parts = [r for r in (self._rows, *self._odd) if r is not None and len(r)]
        if not parts:
            return empty(DONE_OP_COLUMNS)
        return stack_rows(parts)

    def _prev_issue(
        self, comm: np.ndarray, seq: np.ndarray, rank: np.ndarray, issue: np.ndarray
    ) -> np.ndarray:
        """Return per row the issue time of the same rank's previous completed
        op on the same comm (-1 when none), and remember each (comm, rank)'s
        newest. Rows are those of whole collectives; a comm completes its ops
        in seq order, so seq orders them within a (comm, rank)."""
        uniq, inv = np.unique(comm, return_inverse=True)
        codes = self._comm_code
        code = np.array([codes.setdefault(c, len(codes)) for c in uniq.tolist()])
        key = (code[inv.ravel()].astype(np.int64) << 32) | rank.astype(np.int64)
        order = np.lexsort((seq, key))
        k, t = key[order], issue[order]
        run = run_starts(k)
        prev = np.empty(len(k), np.int64)
        prev[1:] = t[:-1]
        known, at = self._find_prev(k[run])
        prev[run] = np.where(known, self._prev_times[at], -1)
        last = np.r_[run[1:], True]
        known, at = self._find_prev(k[last])
        self._prev_times[at[known]] = t[last][known]
        if not known.all():
            keys = np.concatenate([self._prev_keys, k[last][~known]])
            times = np.concatenate([self._prev_times, t[last][~known]])
            by_key = np.argsort(keys, kind="stable")
            self._prev_keys, self._prev_times = keys[by_key], times[by_key]
        out = np.empty(len(k), np.int64)
        out[order] = prev
        return out

    def _find_prev(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(known, index)`` of ``keys`` in the remembered keys."""
        at = np.minimum(
            np.searchsorted(self._prev_keys, keys), len(self._prev_keys) - 1
        )
        return self._prev_keys[at] == keys, at

    def expire(
        self, now_ns: int, timeout_ns: int, max_rows: int = MAX_PARTIAL_ROWS
    ) -> None:
        """Drop partial collectives whose first row arrived over
        ``timeout_ns`` before ``now_ns`` (a member that never reports), and
        the oldest ones while more than ``max_rows`` rows are partial."""
        rows = self._rows
        if rows is None or not len(rows):
            return
        comm, seq = rows["comm"], rows["seq"]
        starts = np.flatnonzero(run_starts(comm, seq))
        count = np.diff(np.r_[starts, len(rows)])
        first = np.minimum.reduceat(self._at, starts)
        old = now_ns - first > timeout_ns
        if len(rows) > max_rows:
            newest = np.argsort(-first, kind="stable")  # ties: the earlier kept
            kept = np.cumsum(count[newest]) <= max_rows
            old[newest[~kept]] = True
        if old.any():
            keep = ~np.repeat(old, count)
            self._rows, self._at = rows[keep], self._at[keep]
            self._batch = self._batch[keep]


def _majority(kinds: np.ndarray) -> int:
    """The most common code (the smallest among equals)."""
    uniq, counts = np.unique(kinds, return_counts=True)
    return int(uniq[np.argmax(counts)])


class RecentStats:
    """The last ``per_comm`` completed collectives of every communicator.

    One bounded deque for the whole job would hold a fraction of a second at
    scale (a 1,024-rank job completes ~18,000 collectives per second, mostly
    pipeline send/recv and tensor-parallel ops), flushing the data-parallel
    ops that a slowdown's root cause compares ranks on. Per communicator,
    every group keeps its recent ops whatever the others' rate.
    """

    def __init__(self, per_comm: int = 64) -> None:
        self.per_comm = per_comm
        self._by_comm: dict[int, deque[CollectiveStat]] = {}

    def append(self, stat: CollectiveStat) -> None:
        """Keep ``stat``, dropping its comm's oldest beyond ``per_comm``."""
        kept = self._by_comm.get(stat.comm)
        if kept is None:
            kept = self._by_comm[stat.comm] = deque(maxlen=self.per_comm)
        kept.append(stat)

    def extend(self, stats: Sequence[CollectiveStat]) -> None:
        """:meth:`append` each of ``stats``, in order, a comm at a time."""
        by_comm: dict[int, list[CollectiveStat]] = {}
        for stat in stats:
            block = by_comm.get(stat.comm)
            if block is None:
                by_comm[stat.comm] = [stat]
            else:
                block.append(stat)
        for comm, block in by_comm.items():
            kept = self._by_comm.get(comm)
            if kept is None:
                kept = self._by_comm[comm] = deque(maxlen=self.per_comm)
            kept.extend(block)

    def since(self, t_ns: int) -> list[CollectiveStat]:
        """Collectives that ended (last member) at or after ``t_ns``, in order
        of completion (ties by comm and seq)."""
        # A refresh of a slowdown's root cause reads every kept op (~50,000
        # at 1,024 ranks): flat columns and one lexsort, not a tuple per op
        # sorted by Python comparisons (10x the cost). Comm ids are unsigned
        # 64-bit, so they sort by their order among the kept comms.
        comms = sorted(self._by_comm)
        kept = list(chain.from_iterable(self._by_comm[c] for c in comms))
        n = len(kept)
        end = np.fromiter((s.last_end_ns for s in kept), np.int64, n)
        seq = np.fromiter((s.seq for s in kept), np.int64, n)
        comm = np.repeat(np.arange(len(comms)), [len(self._by_comm[c]) for c in comms])
        rows = np.flatnonzero(end >= t_ns)
        rows = rows[np.lexsort((seq[rows], comm[rows], end[rows]))]
        return [kept[i] for i in rows.tolist()]

    def __getstate__(self) -> tuple[int, np.ndarray, np.ndarray]:
        """Pickle (worker snapshots) as columns: see :func:`pack_stats`."""
        ops = list(chain.from_iterable(self._by_comm.values()))
        return (self.per_comm, *pack_stats(ops))

    def __setstate__(self, state: tuple[int, np.ndarray, np.ndarray]) -> None:
        """Restore from :meth:`__getstate__`."""
        per_comm, ops, block = state
        self.per_comm, self._by_comm = per_comm, {}
        self.extend(unpack_stats(ops, block))

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._by_comm.values())

    def __iter__(self) -> Iterator[CollectiveStat]:
        return iter(self.since(-(1 << 62)))
