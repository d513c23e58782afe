"""Cross-rank view of completed collectives: who arrived late, who finished last."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mycroft.schemas.records import CompletionBatch
from mycroft.schemas.vocab import OP_NAMES

_SEND, _RECV = OP_NAMES.index("send"), OP_NAMES.index("recv")


def matching_kind(kind: np.ndarray) -> np.ndarray:
    """Return op kind codes as they must agree across one ``(comm, seq)``.

    A point-to-point transfer is one op seen from two sides: one rank reports
    ``send``, its peer ``recv`` at the same seq. Both map to ``send`` so that
    the pair agrees; every other kind maps to itself.
    """
    out: np.ndarray = np.where(kind == _RECV, _SEND, kind).astype(kind.dtype)
    return out


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

    @property
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

    @property
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
        return int(np.median(self.issue_ns[ok] - self.prev_issue_ns[ok]))

    def lateness_ns(self) -> np.ndarray:
        """Per-rank arrival (kernel start) minus the members' median arrival."""
        begin = self.begin_ns
        out: np.ndarray = begin - np.median(begin)
        return out

    def end_lag_ns(self) -> np.ndarray:
        """Per-rank completion minus the members' median completion."""
        out: np.ndarray = self.end_ns - np.median(self.end_ns)
        return out


class CompletionTracker:
    """Collects per-rank completions until every member of the comm reported."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, int], list[np.ndarray]] = {}
        self._first_seen: dict[tuple[int, int], int] = {}
        self._prev_issue: dict[tuple[int, int], int] = {}
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
        keys = np.stack([op["comm"].astype(np.uint64), op["seq"].astype(np.uint64)], 1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        done: list[CollectiveStat] = []
        for i, (comm, seq) in enumerate(uniq.tolist()):
            rows = op[inv.ravel() == i]
            key = (int(comm), int(seq))
            self._record_signatures(key, rows)
            parts = self._partial.setdefault(key, [])
            parts.append(rows)
            self._first_seen.setdefault(key, now_ns)
            stat = self._maybe_finish(key, members.get(key[0], 0))
            if stat is not None:
                done.append(stat)
        return done

    def _record_signatures(self, key: tuple[int, int], rows: np.ndarray) -> None:
        sigs = self.signatures.setdefault(key, {})
        for kind, nbytes, rank in zip(
            matching_kind(rows["kind"]).tolist(),
            rows["bytes"].tolist(),
            rows["rank"].tolist(),
            strict=True,
        ):
            lst = sigs.setdefault((kind, nbytes), [])
            if rank not in lst:
                lst.append(rank)

    def _maybe_finish(self, key: tuple[int, int], nranks: int) -> CollectiveStat | None:
        rows = np.concatenate(self._partial[key])
        _, first = np.unique(rows["rank"], return_index=True)
        rows = rows[first]
        if nranks <= 0 or len(rows) < nranks:
            return None
        del self._partial[key]
        del self._first_seen[key]
        prev = np.array(
            [self._prev_issue.get((key[0], r), -1) for r in rows["rank"].tolist()],
            dtype=np.int64,
        )
        for r, t in zip(rows["rank"].tolist(), rows["issue_ns"].tolist(), strict=True):
            self._prev_issue[(key[0], r)] = t
        kinds, counts = np.unique(matching_kind(rows["kind"]), return_counts=True)
        return CollectiveStat(
            comm=key[0],
            seq=key[1],
            kind=int(kinds[np.argmax(counts)]),
            nbytes=int(np.median(rows["bytes"])),
            ranks=rows["rank"].copy(),
            issue_ns=rows["issue_ns"].copy(),
            start_ns=rows["start_ns"].copy(),
            end_ns=rows["end_ns"].copy(),
            prev_issue_ns=prev,
        )

    def expire(self, now_ns: int, timeout_ns: int, keep_sigs: int = 256) -> None:
        """Drop partial collectives older than ``timeout_ns`` and old signatures."""
        old = [k for k, t in self._first_seen.items() if now_ns - t > timeout_ns]
        for k in old:
            self._partial.pop(k, None)
            self._first_seen.pop(k, None)
        if len(self.signatures) > keep_sigs * 4:
            for k in sorted(self.signatures, key=lambda k: k[1])[:-keep_sigs]:
                del self.signatures[k]
