"""Stall rhythm: a pause that resolved and recurs is the job's own, not a hang.

A rank-0 checkpoint, an evaluation phase or a host-side sync stops a
communicator for seconds while its other members wait in the next
collective, then the job goes on; it recurs with the job's own rhythm. The
hang detector alone pages every time. :class:`StallRhythm` remembers the
stalls that resolved, per communicator and *holders* (the members that had
not issued the op the others wait in), and calls a stall of the same comm
and holders that is still within ``rhythm_mult`` times the longest earlier
pause of that key a *recurring pause*: not a hang, a cost
(:meth:`StallRhythm.costs`).

A stall past that bound, one with no history, or one of another comm or
holder set is judged by the hang detector as before. The trade-off: the
first pause of a rhythm pages once when it is longer than the hang
threshold (nothing tells it from a hang before it resolves), and a real
hang of the same comm and holders is detected only past the bound.

Everything is in event time (the hosts' ticks), so the verdicts are a
function of the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.progress import ProgressStore

Key = tuple[int, tuple[int, ...]]
"""``(comm, holders)``: whose stall it is."""
_SHOWN = 8
"""Holders named in a cost line; more are counted."""
Progress = dict[int, tuple[int, int, bool]]
"""``comm -> (last progress ns, latest host tick ns, work in flight)``
(``detect.comm_last_progress``)."""


@dataclass(frozen=True)
class Pause:
    """One stall of a communicator that resolved (event time, ns)."""

    comm: int
    holders: tuple[int, ...]
    start_ns: int
    end_ns: int

    @property
    def length_ns(self) -> int:
        """How long the communicator made no progress."""
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class PauseCost:
    """What the recurring pauses of one holder set cost the job.

    Pauses of several comms at once (every comm of a paused rank stops) are
    counted once: ``count`` and ``total_s`` are over the union of their
    intervals.
    """

    holders: tuple[int, ...]
    comms: tuple[int, ...]
    count: int
    total_s: float
    longest_s: float
    every_s: float
    share: float

    @property
    def mean_s(self) -> float:
        """Mean length of one pause, seconds."""
        return self.total_s / max(self.count, 1)


@dataclass
class _Open:
    """A stall going on: its holders when last seen and its start."""

    holders: tuple[int, ...]
    start_ns: int


@dataclass
class StallRhythm:
    """Resolved stalls per ``(comm, holders)`` and the bound they give.

    Args:
        cfg: ``rhythm_min_s``, ``rhythm_mult``, ``rhythm_keep`` are read.
    """

    cfg: DetectorConfig
    open: dict[int, _Open] = field(default_factory=dict)
    pauses: dict[Key, list[Pause]] = field(default_factory=dict)
    first_ns: int = 0
    last_ns: int = 0

    def step(self, progress: Progress) -> None:
        """Close the stalls whose comm progressed again; extend the job span."""
        ticks = [t for _, t, _ in progress.values() if t > 0]
        if ticks:
            self.first_ns = self.first_ns or min(ticks)
            self.last_ns = max(self.last_ns, *ticks)
        for comm, stall in list(self.open.items()):
            last = progress.get(comm, (0, 0, False))[0]
            if last > stall.start_ns:
                del self.open[comm]
                self._remember(Pause(comm, stall.holders, stall.start_ns, last))

    def watch(self, comm: int, holders: tuple[int, ...], last_ns: int) -> None:
        """Note that busy ``comm`` is stalled since ``last_ns`` (for at least
        ``rhythm_min_s``), held by ``holders``."""
        self.open[comm] = _Open(holders, last_ns)

    def recurring(self, comm: int, holders: tuple[int, ...], stall_ns: int) -> bool:
        """Whether a stall of ``stall_ns`` is within the bound its key's
        earlier pauses give (``rhythm_mult`` x the longest); False without
        history."""
        bound = self.bound_ns((comm, holders))
        return bound is not None and stall_ns <= bound

    def bound_ns(self, key: Key) -> int | None:
        """The longest stall of ``key`` that counts as recurring (None: no
        earlier pause)."""
        past = self.pauses.get(key)
        if not past:
            return None
        return int(self.cfg.rhythm_mult * max(p.length_ns for p in past))

    def _remember(self, pause: Pause) -> None:
        if pause.length_ns < self.cfg.rhythm_min_s * 1e9:
            return
        past = self.pauses.setdefault((pause.comm, pause.holders), [])
        past.append(pause)
        del past[: -self.cfg.rhythm_keep]

    def costs(self) -> list[PauseCost]:
        """The recurring pauses (two or more of a holder set), costliest first."""
        by_holders: dict[tuple[int, ...], list[Pause]] = {}
        for (_, holders), past in self.pauses.items():
            by_holders.setdefault(holders, []).extend(past)
        span_ns = max(self.last_ns - self.first_ns, 1)
        out = [_cost(h, ps, span_ns) for h, ps in by_holders.items()]
        kept = [c for c in out if c.count >= 2]  # noqa: PLR2004 - recurs: twice
        return sorted(kept, key=lambda c: (-c.total_s, c.holders))


def _cost(holders: tuple[int, ...], pauses: list[Pause], span_ns: int) -> PauseCost:
    """One holder set's pauses, overlapping intervals merged."""
    merged = _union(sorted((p.start_ns, p.end_ns) for p in pauses))
    lengths = np.array([e - s for s, e in merged], dtype=np.float64) / 1e9
    starts = np.array([s for s, _ in merged], dtype=np.float64) / 1e9
    every = float(np.median(np.diff(starts))) if len(starts) > 1 else 0.0
    total = float(lengths.sum())
    return PauseCost(
        holders=holders,
        comms=tuple(sorted({p.comm for p in pauses})),
        count=len(merged),
        total_s=total,
        longest_s=float(lengths.max()),
        every_s=every,
        share=total / (span_ns / 1e9),
    )


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted intervals with overlapping ones merged."""
    out: list[tuple[int, int]] = []
    for s, e in intervals:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def stall_holders(store: ProgressStore, comm: int) -> tuple[int, ...]:
    """Members of ``comm`` that had not issued the op the others wait in
    (none: every member is inside it)."""
    s = store.slots
    m = s["comm"] == comm
    frontier = int(s["done"][m].min()) + 1
    held = m & (s["issued"] < frontier)
    return tuple(sorted(set(s["rank"][held].tolist())))


def describe(cost: PauseCost) -> str:
    """One line for an operator: who pauses, how often, what it costs."""
    shown = ",".join(str(r) for r in cost.holders[:_SHOWN])
    more = f" (+{len(cost.holders) - _SHOWN})" if len(cost.holders) > _SHOWN else ""
    plural = "s" if len(cost.holders) > 1 else ""
    who = f"rank{plural} {shown}{more}" if cost.holders else "ranks inside an op"
    every = f"every ~{cost.every_s:.0f} s " if cost.every_s else ""
    return (
        f"{who} pause {every}for ~{cost.mean_s:.1f} s "
        f"({cost.count} pauses, {cost.total_s:.1f} s): "
        f"{100 * cost.share:.1f} % of the job"
    )
