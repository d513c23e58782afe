"""Cross-rank view of completed collectives: who arrived late, who finished last."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mycroft.schemas.records import CompletionBatch
from mycroft.schemas.vocab import OP_NAMES
from mycroft.streams.core.rows import stack_rows

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


@dataclass(frozen=True)
class CollectiveStat:
    """One collective completed by every member (times on host clocks, ns).

    Attributes:
        comm, seq, kind, nbytes: Identity of the op (kind: code of OP_NAMES).
        ranks: Members, in the order of the time arrays.
        issue_ns, start_ns, end_ns: Per-rank enqueue, first progress, completion.
        prev_issue_ns: Per-rank issue time of the previous op on this comm
            (-1 when unknown).
    """

    comm: int
    seq: int
    kind: int
    nbytes: int
    ranks: np.ndarray
    issue_ns: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    prev_issue_ns: np.ndarray

    def __getstate__(self) -> tuple[int, int, int, int, str, bytes]:
        """Pickle (worker snapshots) as one block of int64 columns: a snapshot
        holds thousands of these, and a numpy array each costs more to pickle
        than its data. Cached properties are not kept."""
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
        fields = {"comm": comm, "seq": seq, "kind": kind, "nbytes": nbytes}
        fields |= {"ranks": cols[0].astype(rank_dtype), "issue_ns": cols[1]}
        fields |= {"start_ns": cols[2], "end_ns": cols[3], "prev_issue_ns": cols[4]}
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    @cached_property
    def last_end_ns(self) -> int:
        """Completion of the last member (host clock of that member)."""
        return int(self.end_ns.max())

    @cached_property
    def begin_ns(self) -> np.ndarray:
        """Per-rank kernel start (first progress), the issue time if unknown.

        The CPU enqueues ops ahead of the GPU (during the preceding compute),
        so the enqueue time says when the *CPU* got there; the first progress
        says when the rank itself arrived at the collective.
        """
        out: np.ndarray = np.where(self.start_ns > 0, self.start_ns, self.issue_ns)
        return out

    @property
    def queued_span_ns(self) -> int:
        """First enqueue to last completion, queueing behind compute included."""
        return int(self.end_ns.max() - self.issue_ns.min())

    @cached_property
    def span_ns(self) -> int:
        """First arrival (kernel start) to last completion: what the op cost."""
        return int(self.end_ns.max() - self.begin_ns.min())

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


def _group_by_op(
    op: np.ndarray,
) -> tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, int] | None], list[int]]:
    """Sort one batch's op rows by (comm, seq), unsigned, keeping arrival order
    within an op (stable sort).

    Returns:
        ``(rows, keys, sigs, bounds)``: the sorted rows; per op its
        ``(comm, seq)``, its signature ``(matching kind, bytes)`` when all its
        rows agree (else None), and its rows ``rows[bounds[i]:bounds[i + 1]]``.
        Per-op facts come from ``reduceat`` over all ops at once.
    """
    comm, seq = op["comm"].astype(np.uint64), op["seq"].astype(np.uint64)
    order = np.lexsort((seq, comm))
    op, comm, seq = op[order], comm[order], seq[order]
    cut = np.flatnonzero((comm[1:] != comm[:-1]) | (seq[1:] != seq[:-1])) + 1
    starts = np.concatenate([[0], cut])
    kinds, nbytes = matching_kind(op["kind"]), op["bytes"]
    kind0 = np.minimum.reduceat(kinds, starts)
    bytes0 = np.minimum.reduceat(nbytes, starts)
    agree = (kind0 == np.maximum.reduceat(kinds, starts)) & (
        bytes0 == np.maximum.reduceat(nbytes, starts)
    )
    keys = list(zip(comm[starts].tolist(), seq[starts].tolist(), strict=True))
    sigs: list[tuple[int, int] | None] = [
        (k, b) if ok else None
        for k, b, ok in zip(
            kind0.tolist(), bytes0.tolist(), agree.tolist(), strict=True
        )
    ]
    return op, keys, sigs, [*starts.tolist(), len(op)]


class CompletionTracker:
    """Collects per-rank completions until every member of the comm reported."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, int], list[np.ndarray]] = {}
        self._seen: dict[tuple[int, int], set[int]] = {}
        self._first_seen: dict[tuple[int, int], int] = {}
        self._prev_issue: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.signatures: dict[tuple[int, int], dict[tuple[int, int], list[int]]] = {}

    def ingest(
        self, batch: CompletionBatch, members: dict[int, int], now_ns: int
    ) -> list[CollectiveStat]:
        """Add one host's completions; return the collectives now complete.

        Args:
            batch: Completed ops of one host in one tick.
            members: ``comm -> nranks`` for comms whose size is known.
            now_ns: Caller's clock, for expiry of partial collectives.
        """
        op = batch.op
        if not len(op):
            return []
        op, keys, sigs, bounds = _group_by_op(op)
        ranks = op["rank"].tolist()
        complete: list[tuple[int, int]] = []
        for g, (key, sig) in enumerate(zip(keys, sigs, strict=True)):
            lo, hi = bounds[g], bounds[g + 1]
            group = ranks[lo:hi]
            if sig is not None:
                self._record_signature(key, sig, group)
            else:  # the host's members disagree: row by row
                rows = op[lo:hi]
                for row_sig, rank in zip(
                    zip(
                        matching_kind(rows["kind"]).tolist(),
                        rows["bytes"].tolist(),
                        strict=True,
                    ),
                    group,
                    strict=True,
                ):
                    self._record_signature(key, row_sig, [rank])
            self._partial.setdefault(key, []).append(op[lo:hi])
            seen = self._seen.setdefault(key, set())
            seen.update(group)
            self._first_seen.setdefault(key, now_ns)
            nranks = members.get(key[0], 0)
            if 0 < nranks <= len(seen):
                complete.append(key)
        return self._finish(complete) if complete else []

    def _record_signature(
        self, key: tuple[int, int], sig: tuple[int, int], ranks: list[int]
    ) -> None:
        """Add ``ranks`` (in order, once each) to the ranks that reported
        ``sig`` = (matching kind, bytes) for op ``key``."""
        lst = self.signatures.setdefault(key, {}).setdefault(sig, [])
        if not lst and len(set(ranks)) == len(ranks):
            lst.extend(ranks)
            return
        have = set(lst)
        for r in ranks:
            if r not in have:
                lst.append(r)
                have.add(r)

    def _finish(self, keys: list[tuple[int, int]]) -> list[CollectiveStat]:
        """Build the collectives ``keys`` (complete, in completion order) from
        their rows: each member's first row, members by rank; all of them
        sorted and reduced at once."""
        parts: list[np.ndarray] = []
        owner: list[int] = []
        for i, key in enumerate(keys):
            got = self._partial.pop(key)
            del self._seen[key], self._first_seen[key]
            parts += got
            owner += [i] * len(got)
        rows = stack_rows(parts)
        op_of = np.repeat(np.array(owner), [len(p) for p in parts])
        order = np.lexsort((rows["rank"], op_of))  # stable: first report first
        rows, op_of = rows[order], op_of[order]
        rank = rows["rank"]
        first = np.r_[True, (op_of[1:] != op_of[:-1]) | (rank[1:] != rank[:-1])]
        if not first.all():  # a rank reported twice: keep its first row
            rows, op_of = rows[first], op_of[first]
        rank = np.ascontiguousarray(rows["rank"])
        starts = np.searchsorted(op_of, np.arange(len(keys) + 1))
        cols = [
            np.ascontiguousarray(rows[f]) for f in ("issue_ns", "start_ns", "end_ns")
        ]
        kinds, nbytes = matching_kind(rows["kind"]), rows["bytes"]
        at = starts[:-1]
        one_kind = np.minimum.reduceat(kinds, at) == np.maximum.reduceat(kinds, at)
        one_size = np.minimum.reduceat(nbytes, at) == np.maximum.reduceat(nbytes, at)
        out = []
        for i, (key, lo, hi) in enumerate(
            zip(keys, starts[:-1].tolist(), starts[1:].tolist(), strict=True)
        ):
            members, issue = rank[lo:hi], cols[0][lo:hi]
            kind = int(kinds[lo]) if one_kind[i] else _majority(kinds[lo:hi])
            size = int(nbytes[lo]) if one_size[i] else int(small_median(nbytes[lo:hi]))
            out.append(
                CollectiveStat(
                    comm=key[0],
                    seq=key[1],
                    kind=kind,
                    nbytes=size,
                    ranks=members,
                    issue_ns=issue,
                    start_ns=cols[1][lo:hi],
                    end_ns=cols[2][lo:hi],
                    prev_issue_ns=self._swap_prev_issue(key[0], members, issue),
                )
            )
        return out

    def _swap_prev_issue(
        self, comm: int, ranks: np.ndarray, issue: np.ndarray
    ) -> np.ndarray:
        """Return each member's issue time of the comm's previous completed op
        (-1 when none) and remember ``issue`` for the next one. ``ranks`` are
        sorted; the comm's known members are kept as a sorted array."""
        known = self._prev_issue.get(comm)
        if (
            known is not None
            and len(known[0]) == len(ranks)
            and known[0].tobytes() == ranks.tobytes()
        ):
            prev = known[1].copy()
            known[1][:] = issue
            return prev
        if known is None:
            known = (np.zeros(0, ranks.dtype), np.zeros(0, np.int64))
        members, times = known
        new = np.setdiff1d(ranks, members, assume_unique=True)
        if len(new):
            at = np.searchsorted(members, new)
            members = np.insert(members, at, new)
            times = np.insert(times, at, -1)
        pos = np.searchsorted(members, ranks)
        prev = times[pos]
        times[pos] = issue
        self._prev_issue[comm] = (members, times)
        return prev

    def expire(self, now_ns: int, timeout_ns: int, keep_sigs: int = 256) -> None:
        """Drop partial collectives older than ``timeout_ns`` and old signatures."""
        old = [k for k, t in self._first_seen.items() if now_ns - t > timeout_ns]
        for k in old:
            self._partial.pop(k, None)
            self._seen.pop(k, None)
            self._first_seen.pop(k, None)
        if len(self.signatures) > keep_sigs * 4:
            for k in sorted(self.signatures, key=lambda k: k[1])[:-keep_sigs]:
                del self.signatures[k]


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

    def since(self, t_ns: int) -> list[CollectiveStat]:
        """Collectives that ended (last member) at or after ``t_ns``, in order
        of completion (ties by comm and seq)."""
        found = [
            (s.last_end_ns, s.comm, s.seq, s)
            for kept in self._by_comm.values()
            for s in kept
            if s.last_end_ns >= t_ns
        ]
        found.sort(key=lambda x: x[:3])
        return [x[3] for x in found]

    def newest_ns(self) -> int:
        """Completion of the newest kept collective (0 when empty)."""
        return max(
            (kept[-1].last_end_ns for kept in self._by_comm.values() if kept), default=0
        )

    def keep_since(self, t_ns: int) -> None:
        """Forget collectives that ended before ``t_ns`` (snapshots)."""
        for comm in list(self._by_comm):
            kept = [s for s in self._by_comm[comm] if s.last_end_ns >= t_ns]
            if kept:
                self._by_comm[comm] = deque(kept, maxlen=self.per_comm)
            else:
                del self._by_comm[comm]

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._by_comm.values())

    def __iter__(self) -> Iterator[CollectiveStat]:
        return iter(self.since(-(1 << 62)))
