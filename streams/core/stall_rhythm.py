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

A stall past that bound, one with no history, one of another comm or
holder set, or one inside an op (every member issued it: the transport or
a GPU, never the training loop's own pause) is judged by the hang detector
as before. The op a recurring pause held up completes with the pause in
its span and its late member's lateness: its slowdowns are the pause too,
and :meth:`StallRhythm.excuse` drops them. The trade-off: the
first pause of a rhythm pages once when it is longer than the hang
threshold (nothing tells it from a hang before it resolves), and a real
hang of the same comm and holders is detected only past the bound.

Everything is in event time (the hosts' ticks), so the verdicts are a
function of the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from mycroft.schemas.records import Anomaly
from mycroft.schemas.vocab import FaultKind
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
    recurring: bool = False

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
    recurring: bool


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
    excused: int = 0

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
                pause = Pause(comm, stall.holders, stall.start_ns, last)
                self._remember(replace(pause, recurring=stall.recurring))

    def held(self, comm: int, last_ns: int) -> tuple[int, ...] | None:
        """The holders of ``comm``'s stall since ``last_ns`` as first seen
        (None: not watched yet). A stall keeps the holders it began with:
        as the ranks it held catch up one by one, the last to issue its op
        is not what held it."""
        stall = self.open.get(comm)
        return (
            stall.holders if stall is not None and stall.start_ns == last_ns else None
        )

    def watch(
        self, comm: int, holders: tuple[int, ...], last_ns: int, stall_ns: int
    ) -> bool:
        """Note that busy ``comm`` is stalled since ``last_ns`` for
        ``stall_ns`` (at least ``rhythm_min_s``), held by ``holders``;
        return whether that is a recurring pause (:meth:`recurring`)."""
        again = self.recurring(comm, holders, stall_ns)
        self.open[comm] = _Open(holders, last_ns, again)
        return again

    def recurring(self, comm: int, holders: tuple[int, ...], stall_ns: int) -> bool:
        """Whether a stall of ``stall_ns`` is within the bound its key's
        earlier pauses give (``rhythm_mult`` x the longest); False without
        history."""
        bound = self.bound_ns((comm, holders))
        return bool(holders) and bound is not None and stall_ns <= bound

    def bound_ns(self, key: Key) -> int | None:
        """The longest stall of ``key`` that counts as recurring (None: no
        earlier pause)."""
        past = self.pauses.get(key)
        if not past:
            return None
        return int(self.cfg.rhythm_mult * max(p.length_ns for p in past))

    def excuse(self, found: list[Anomaly]) -> list[Anomaly]:
        """``found`` without the slowdowns of ops that a recurring pause of
        their comm held up (the op ran from ``onset_ns`` to at most
        ``detected_ns``); counts them in ``excused``."""
        kept = [a for a in found if not self._in_pause(a)]
        self.excused += len(found) - len(kept)
        return kept

    def _in_pause(self, a: Anomaly) -> bool:
        if a.kind is not FaultKind.SLOWDOWN or len(a.comms) != 1:
            return False
        comm = a.comms[0]
        spans = [
            (p.start_ns, p.end_ns)
            for (c, _), past in self.pauses.items()
            if c == comm
            for p in past
            if p.recurring
        ]
        stall = self.open.get(comm)
        if stall is not None and stall.recurring:
            spans.append((stall.start_ns, a.detected_ns))
        return any(a.onset_ns <= e and a.detected_ns >= s for s, e in spans)

    def _remember(self, pause: Pause) -> None:
        if not pause.holders or pause.length_ns < self.cfg.rhythm_min_s * 1e9:
            return  # a stall inside an op is never the job's own rhythm
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
    """One holder set's pauses: overlapping ones (several comms stopped by
    one pause) are one event, as long as its longest comm's pause (the comms
    it held up in turn stop later and resume later)."""
    events = _events(sorted(pauses, key=lambda p: (p.start_ns, p.end_ns)))
    lengths = np.array([max(p.length_ns for p in e) for e in events]) / 1e9
    starts = np.array([e[0].start_ns for e in events], dtype=np.float64) / 1e9
    every = float(np.median(np.diff(starts))) if len(starts) > 1 else 0.0
    total = float(lengths.sum())
    return PauseCost(
        holders=holders,
        comms=tuple(sorted({p.comm for p in pauses})),
        count=len(events),
        total_s=total,
        longest_s=float(lengths.max()),
        every_s=every,
        share=total / (span_ns / 1e9),
    )


def _events(pauses: list[Pause]) -> list[list[Pause]]:
    """Pauses sorted by start, grouped where their intervals overlap."""
    out: list[list[Pause]] = []
    end = 0
    for p in pauses:
        if out and p.start_ns <= end:
            out[-1].append(p)
            end = max(end, p.end_ns)
        else:
            out.append([p])
            end = p.end_ns
    return out


def stall_holders(
    store: ProgressStore, comm: int, waiting: set[int]
) -> tuple[int, ...]:
    """The ranks whose own program the stall of ``comm`` waits on.

    A comm's holders are its members that had not issued the op the others
    wait in; a holder itself inside an op of a ``waiting`` comm (busy, no
    progress at its newest tick) stands for that comm's holders in turn (a
    data-parallel group waits on the tensor-parallel group that waits on
    rank 0: rank 0 holds both), and stays a holder when every member of that
    comm issued its op. None when every member of ``comm`` itself issued its
    op: the stall is inside it (a transport, a GPU), never the job's rhythm.
    """
    s = store.slots
    busy = s["issued"] > s["done"]
    if not _raw_holders(store, comm):
        return ()
    out: set[int] = set()
    seen, todo = {comm}, [(comm, -1)]
    while todo:
        c, via = todo.pop()
        held = _raw_holders(store, c)
        if not held:
            out.add(via)
        for r in held:
            waits = set(s["comm"][(s["rank"] == r) & busy].tolist()) & waiting
            if not waits:
                out.add(r)
            todo += [(w, r) for w in sorted(waits - seen)]
            seen |= waits
    return tuple(sorted(out))


def _raw_holders(store: ProgressStore, comm: int) -> list[int]:
    """Members of ``comm`` that had not issued its oldest unfinished op."""
    s = store.slots
    m = s["comm"] == comm
    frontier = int(s["done"][m].min()) + 1
    return sorted(set(s["rank"][m & (s["issued"] < frontier)].tolist()))


def describe(cost: PauseCost) -> str:
    """One line for an operator: who pauses, how often, what it costs."""
    shown = ",".join(str(r) for r in cost.holders[:_SHOWN])
    more = f" (+{len(cost.holders) - _SHOWN})" if len(cost.holders) > _SHOWN else ""
    one = len(cost.holders) == 1
    who = f"rank {shown} pauses" if one else f"ranks {shown}{more} pause"
    every = f"every ~{cost.every_s:.0f} s " if cost.every_s else ""
    return (
        f"{who} {every}for ~{cost.mean_s:.1f} s "
        f"({cost.count} pauses, {cost.total_s:.1f} s): "
        f"{100 * cost.share:.1f} % of the job"
    )
