"""Cross-rank view of completed collectives: who arrived late, who finished last."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from itertools import chain

import numpy as np

from mycroft.schemas.columns import DONE_OP_COLUMNS, empty
from mycroft.schemas.op_sizes import sizes_may_differ
from mycroft.schemas.records import CompletionBatch
from mycroft.schemas.vocab import OP_NAMES
from mycroft.streams.core.collective_stat import (
    CollectiveStat,
    make_stats,
    pack_stats,
    small_median,
    unpack_stats,
)
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
        may_differ = np.logical_and.reduceat(sizes_may_differ(rows["kind"]), at)
        agree = one_kind & (one_size | may_differ)
        if not agree.all():
            self._keep_odd(rows[np.repeat(~agree, count)])
        prev_issue = self._prev_issue(cols[4], cols[5], cols[0], cols[1])
        block = np.stack([cols[0].astype(np.int64), *cols[1:4], prev_issue])
        kind, size = kinds[at].tolist(), nbytes[at].tolist()
        for i in np.flatnonzero(~(one_kind & one_size)).tolist():
            lo, hi = int(at[i]), int(at[i] + count[i])
            if not one_kind[i]:
                kind[i] = _majority(kinds[lo:hi])
            if not one_size[i]:
                size[i] = int(small_median(nbytes[lo:hi]))
        keys = (cols[4][at].tolist(), cols[5][at].tolist(), kind, size)
        return make_stats(keys, cols[0], block, at, count)

    def _keep_odd(self, rows: np.ndarray, keep_rows: int = 4096) -> None:
        """Keep the rows of completed collectives whose members disagree on
        kind, or on a size that must agree (``schemas/op_sizes.py``; the
        newest ``keep_rows``) for :meth:`signature_rows`."""
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

    def snapshot_state(self) -> tuple[int, np.ndarray, np.ndarray]:
        """Snapshot state (worker snapshots) as columns: see :func:`pack_stats`."""
        ops = list(chain.from_iterable(self._by_comm.values()))
        return (self.per_comm, *pack_stats(ops))

    def restore_state(self, state: tuple[int, np.ndarray, np.ndarray]) -> None:
        """Restore from :meth:`snapshot_state`."""
        per_comm, ops, block = state
        self.per_comm, self._by_comm = per_comm, {}
        self.extend(unpack_stats(ops, block))

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._by_comm.values())

    def __iter__(self) -> Iterator[CollectiveStat]:
        return iter(self.since(-(1 << 62)))
