"""Cumulative chunk counters per key, from state and completion batches.

A flow's counters (``gpu_ready``, ``transmitted``, ``done``) restart with
every op, so a key's progress over time is the chunks of its completed ops
plus its in-flight counters: ``C(t) = completed(start, t] + in_flight(t)``,
counted from the window's start. A host's completion batch at tick ``t``
holds the ops that ended since its previous tick, gone from its state batch
at ``t``. Batches may come in any order (a trace interleaves the two kinds,
two topics do not): the sums are formed once all are in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SILENT_NS = 1_000_000_000
"""Samples further apart than this: the host was silent in between."""


def flow_ranks(op: np.ndarray) -> np.ndarray:
    """The rank of each flow row (flows follow their op, ``nflows`` each)."""
    return np.repeat(op["rank"], np.maximum(op["nflows"], 0))


@dataclass
class Cumulative:
    """Samples of ``C(t)`` per non-negative integer key (a rank, a flow).

    Keys and chunk counts come in as arrays: ``keys`` of the rows counted,
    ``counts`` a ``(rows, width)`` array. Batches outside ``[start_ns,
    end_ns]`` are not kept.
    """

    width: int
    start_ns: int
    end_ns: int
    _states: list[tuple[int, np.ndarray, np.ndarray]] = field(
        default_factory=list, init=False
    )
    _done: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=list, init=False
    )

    def _inside(self, tick_ns: int) -> bool:
        return self.start_ns <= tick_ns <= self.end_ns

    def state(
        self, tick_ns: int, present: np.ndarray, keys: np.ndarray, counts: np.ndarray
    ) -> None:
        """One state batch's in-flight counters; ``present``: the keys its
        host reports on (sampled even when idle)."""
        if not self._inside(tick_ns):
            return
        ks = np.union1d(present, keys).astype(np.int64)
        if not len(ks):
            return
        value = np.zeros((len(ks), self.width), np.int64)
        np.add.at(value, np.searchsorted(ks, keys), counts)
        self._states.append((tick_ns, ks, value))

    def completion(self, tick_ns: int, keys: np.ndarray, counts: np.ndarray) -> None:
        """One completion batch's chunks of completed ops."""
        if self._inside(tick_ns) and len(keys):
            ticks = np.full(len(keys), tick_ns, np.int64)
            self._done.append((ticks, keys.astype(np.int64), counts.astype(np.int64)))

    def samples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(t_ns, key, C)`` of every state batch's keys, by time then key."""
        if not self._states:
            empty = np.zeros(0, np.int64)
            return empty, empty, np.zeros((0, self.width), np.int64)
        t = np.concatenate(
            [np.full(len(k), tick, np.int64) for tick, k, _ in self._states]
        )
        key = np.concatenate([k for _, k, _ in self._states])
        value = np.concatenate([v for _, _, v in self._states])
        if self._done:
            dt = np.concatenate([d[0] for d in self._done])
            dk = np.concatenate([d[1] for d in self._done])
            dv = np.concatenate([d[2] for d in self._done])
            for k in np.unique(key).tolist():
                mine, theirs = key == k, dk == k
                if not theirs.any():
                    continue
                order = np.argsort(dt[theirs], kind="stable")
                ticks = dt[theirs][order]
                cum = np.vstack([np.zeros((1, self.width), np.int64),
                                 np.cumsum(dv[theirs][order], axis=0)])  # fmt: skip
                value[mine] += cum[np.searchsorted(ticks, t[mine], side="right")]
        order = np.lexsort((key, t))
        return t[order], key[order], value[order]


def binned_rate(
    t: np.ndarray, key: np.ndarray, value: np.ndarray, nkeys: int, edges: np.ndarray
) -> np.ndarray:
    """Chunks moved per key in each bin between ``edges``: the growth of the
    key's ``C(t)``, linear between samples (hosts sample at their own ticks,
    not on the bins). NaN outside the key's samples and across a gap of more
    than ``SILENT_NS`` between two (its host stopped reporting)."""
    out = np.full((nkeys, len(edges) - 1), np.nan)
    for k in range(nkeys):
        mine = key == k
        if not mine.any():
            continue
        kt, kv = t[mine], value[mine, 0].astype(np.float64)
        level = np.interp(edges, kt, kv)
        nxt = np.searchsorted(kt, edges[1:], side="left")
        prev = np.searchsorted(kt, edges[:-1], side="right") - 1
        inside = (prev >= 0) & (nxt < len(kt))
        gap = kt[np.minimum(nxt, len(kt) - 1)] - kt[np.maximum(prev, 0)]
        ok = inside & (gap <= SILENT_NS)
        out[k] = np.where(ok, np.maximum(np.diff(level), 0.0), np.nan)
    return out
