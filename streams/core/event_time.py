"""Event time for a live job: a watermark from the hosts' own ticks.

A verdict must be a function of the records, never of when or how fast a
worker read them. A worker reads a job's four raw topics as one merged
stream whose interleaving depends on fetch sizes, lag and restarts: a
heartbeat can arrive seconds before the state batches of the same tick, or
a host's completions after the next tick's state. :class:`EventClock`
buffers a job's records and hands them to the engine in one canonical order,
interleaved with evaluations every ``cadence_ns`` of *event* time (at
multiples of it in epoch time, :func:`on_grid`), exactly as
``mycroft analyze`` (:class:`mycroft.streams.analyze.Replay`) drives the same
engine over a recorded trace.

Streams and the watermark
-------------------------
Each record type of the job (one topic each) is a stream; its time is the
newest record time read from it. A job's records share one partition of
each topic, appended as the hosts produce them, which is in event time up to
the hosts' send skew: a stream read up to ``t`` has nothing older than
``t - lateness_ns`` left to deliver. The job's reference time is its state
stream's (every live host sends a state batch each tick); the watermark
``W`` is the oldest bound among the streams that may still deliver, and
at least ``lateness_ns`` behind the reference (in-flight records of other
hosts):

* a stream whose topic partition the worker read to its end (*caught up*)
  holds nothing back: what it has not delivered was not produced yet;
* a stream whose partition was read past the job, records produced after
  the job's newest one (*moving*: other jobs' records, appended later),
  holds nothing back either: producers append in the order they produce,
  so what the job still has there was produced later (a hung job's sparse
  completion stream, or a host that died, never hold the others);
* otherwise the reader is *behind* and the stream holds the watermark at
  its newest time, however far back;
* a record type not read yet for the job is a stream at the job's first
  record time: a worker starts reading its topics at different moments.

Records with ``t <= W`` are released in canonical order ``(t, topology <
batches < heartbeats, host, state < completion, arrival)`` (the order the
simulator writes a trace in), and an evaluation at event time ``T`` runs
after every record with ``t < T`` and before any record with ``t >= T``, as
in ``Replay``. A record older than what was already released is *late*: it
is ingested at once and counted (``late``); only a read skew beyond those
bounds makes one. What this does not order: records a host appends far out
of event time (an agent replaying its spool minutes later while the other
hosts stream live) arrive late by design and are counted.

Comm summaries (stage 2)
------------------------
The job stage reads one record type, ``CommSummary``, from one partition,
but its producers are stage-1 workers, each reading its own partitions at
its own pace: a worker seconds behind its input appends the summaries of its
groups long after another worker appended later ticks of the job's other
groups. Appended order is not event order there, so each comm group is a
stream of its own, in order (one engine writes it): the watermark holds at
the oldest group's newest summary (a group not heard from yet: at the job's
first record), so that the job is resolved at each instant from every
group's view of it, as ``TwoStageReplay`` resolves it. A group more than
``group_hold_ns`` behind the newest one (its worker died, or is restoring
on another worker) holds it no further: its summaries arrive late and are
ingested then, and the engine revises its answer on them.

The one rule that reads the wall clock: a job whose every stream is read to
its end and which sent nothing for ``idle_s`` of wall time (the job ended,
every host died, or the broker is away) is *quiet*: every record read is
released and the next tick is evaluated once, as ``Replay.finish`` does at
the end of a trace. Nothing more is concluded from wall time passing (an
engine evaluated on and on without records revises its verdicts on time
alone); records that come later carry on from there, as the same records in
one trace would. Records that arrive late after a quiet evaluation (the last
groups of a lagging stage-1 worker) are evaluated once more when the job is
quiet again.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "EventClock",
    "EventTimeConfig",
    "Source",
    "TimedEngine",
    "on_grid",
    "record_host",
]

Source = Literal["end", "moving", "behind"]
"""Where a worker is in one record type's topic partition, for one job:
``end``, read to its end; ``moving``, read past records produced after the
job's newest one (what the job has left there was produced later);
``behind``, neither (its reader is behind: hold the watermark)."""

_CLASS = {"Topology": 0, "StateBatch": 1, "CompletionBatch": 1, "CommSummary": 1}
"""Canonical order of record classes within one event time (heartbeats: 2)."""
_TYPE = {"StateBatch": 0, "CompletionBatch": 1}
SUMMARY = "CommSummary"
"""The stage-2 input: one stream per comm group (module docstring)."""
DENSE = "StateBatch"
"""The stream every live host sends each tick: the job's reference time. The
sparse streams (completions, heartbeats) are measured against it, and a topic
read far ahead (small heartbeats, many seconds in one fetch) never moves it."""
STREAMS = ("Topology", "StateBatch", "CompletionBatch", "Heartbeat")
"""Record types that hold the watermark before the first one is read (a
``caught_up`` that says True for a type the worker does not consume lets it go)."""


class TimedEngine(Protocol):
    """What the clock drives: an engine with time handed in."""

    def ingest(self, record: Any, now_ns: int) -> None: ...  # noqa: D102

    def evaluate(self, now_ns: int) -> Any: ...  # noqa: D102


STALE_GROUP_NS = 30_000_000_000
"""How long a comm group's latest summary counts at the job stage: the
resolver keeps its view that long (``JobResolver``'s ``stale_s``) and the
job stage's clock waits that long for a trailing group
(``EventTimeConfig.group_hold_ns``). One bound for both: the clock waits for
a group exactly as long as the resolver still counts its view. 30 s: a
lagging stage-1 worker sends its summaries in bursts seconds apart
(``streams/SCALING.md``), and an incident must not close between them."""


@dataclass(frozen=True)
class EventTimeConfig:
    """Bounds of the watermark; each one-line reason is the constant's doc.

    Attributes:
        cadence_ns: Evaluation step of event time: ``mycroft analyze``'s
            (100 ms, the agents' sampling tick).
        max_gap_ns: Longest stretch of event time without records evaluated
            tick by tick; past it the clock jumps to the next record, on the
            same grid (a host clock that jumps years ahead must cost a bounded
            number of evaluations): longer than every detector's window
            (hang threshold at most 10 s, completion timeout 30 s).
        lateness_ns: How far behind the newest record the watermark trails
            once every partition is read to its end: the skew between hosts'
            ticks and the producers' send delay (linger 5 ms, one tick of
            batching) fit in 0.2 s.
        idle_s: Wall seconds with every partition read and no record of the
            job before it is quiet (module docstring): three heartbeat
            periods, so a live job never takes this path.
        group_hold_ns: How far a comm group's summaries may trail the newest
            group's and still hold the job stage's watermark:
            :data:`STALE_GROUP_NS`, the resolver's default ``stale_s`` too,
            within which a group's latest view still counts; a stage-1 worker
            further behind is not waited for.
    """

    cadence_ns: int = 100_000_000
    max_gap_ns: int = 60_000_000_000
    lateness_ns: int = 200_000_000
    idle_s: float = 3.0
    group_hold_ns: int = STALE_GROUP_NS

    def __post_init__(self) -> None:
        """Reject bounds that cannot hold a watermark."""
        if self.cadence_ns <= 0:
            raise ValueError(f"cadence_ns must be > 0, got {self.cadence_ns}")
        if self.max_gap_ns < self.cadence_ns:
            raise ValueError(f"max_gap_ns must be >= cadence_ns, got {self.max_gap_ns}")
        if self.lateness_ns < 0:
            raise ValueError(f"lateness_ns must be >= 0, got {self.lateness_ns}")
        if self.idle_s <= 0:
            raise ValueError(f"idle_s must be > 0, got {self.idle_s}")
        if self.group_hold_ns < 0:
            raise ValueError(f"group_hold_ns must be >= 0, got {self.group_hold_ns}")


def on_grid(t_ns: int, cadence_ns: int) -> int:
    """The first evaluation instant at or after ``t_ns``: a multiple of the
    cadence in epoch time, so that every reader of a job evaluates at the same
    instants whichever record it saw first (a topology stamped on its host's
    clock, a few ms off its ticks, or a state batch)."""
    return -(-t_ns // cadence_ns) * cadence_ns


def record_host(record: Any) -> str:
    """Host of a raw record (batch header, heartbeat, topology), else ``""``."""
    header = getattr(record, "header", None)
    if header is not None:
        return str(header.host)
    return str(getattr(record, "host", ""))


@dataclass
class EventClock:
    """One job's reorder buffer, watermark and evaluation cadence.

    ``push`` a record as it is read; ``advance`` releases what the watermark
    passed into the engine, evaluating on the way, and returns the findings.
    Picklable: it is part of the job's snapshot, so records read but not yet
    released survive a restart (offsets are committed with the snapshot).
    """

    config: EventTimeConfig = field(default_factory=EventTimeConfig)
    streams: dict[str, int] = field(default_factory=dict)
    first_ns: int = -1
    newest_ns: int = 0
    released_ns: int = -1  # time of the newest record handed to the engine
    next_eval_ns: int = -1
    late: int = 0
    skipped_ticks: int = 0  # evaluations left out across gaps over max_gap_ns
    quiet_ns: int = -1  # released_ns when the quiet rule last evaluated
    quiet_late: int = 0  # ``late`` when the quiet rule last evaluated
    groups: dict[int, int] = field(default_factory=dict)  # comm group -> newest
    group_count: int = 0  # comm groups of the job (0: not a stage-2 clock)
    held: bool = False  # the last advance stopped at its evaluation budget
    _heap: list[tuple[int, int, str, int, int, Any]] = field(default_factory=list)
    _arrivals: Any = field(default_factory=itertools.count, repr=False)
    _out_of_time: Callable[[], bool] | None = field(
        default=None, repr=False, compare=False
    )  # the current advance's deadline

    def snapshot_state(self) -> dict[str, Any]:
        """Snapshot state without the arrival counter (restarted from the heap size)
        and without the current advance's deadline."""
        state = dict(self.__dict__)
        state["_arrivals"] = len(self._heap)
        state["_out_of_time"] = None
        return state

    def restore_state(self, state: dict[str, Any]) -> None:
        """Restore, with an arrival counter past every buffered record."""
        start = max((e[4] for e in state["_heap"]), default=-1) + 1
        state["_arrivals"] = itertools.count(start)
        self.__dict__.update(state)

    @property
    def pending(self) -> int:
        """Records read and not yet released."""
        return len(self._heap)

    def push(self, record: Any, t_ns: int) -> None:
        """Buffer one record of event time ``t_ns``."""
        name = type(record).__name__
        host = record_host(record)
        if t_ns > self.streams.get(name, -1):
            self.streams[name] = t_ns
        if self.first_ns < 0 or t_ns < self.first_ns:
            self.first_ns = t_ns
        self.newest_ns = max(self.newest_ns, t_ns)
        if name == SUMMARY:
            group = int(record.group)
            self.groups[group] = max(self.groups.get(group, -1), t_ns)
            self.group_count = max(self.group_count, int(record.groups))
        entry = (
            t_ns,
            _CLASS.get(name, 2),
            host,
            _TYPE.get(name, 0),
            next(self._arrivals),
            record,
        )
        heapq.heappush(self._heap, entry)

    def watermark(self, source: Callable[[str], Source]) -> int:
        """Event time up to which every record has been read (``-1``: none).

        ``source(record_type)`` says where the worker is in that record
        type's topic partition (:data:`Source`).
        """
        if not self.streams:
            return -1
        cfg = self.config
        ref = self.streams.get(DENSE, self.newest_ns)
        w = ref - cfg.lateness_ns
        times = {name: self.first_ns for name in STREAMS} | self.streams
        for name, t in times.items():
            if source(name) == "behind":
                w = min(w, t - cfg.lateness_ns)
        if self.group_count:
            w = min(w, self._group_bound())
        return w

    def _group_bound(self) -> int:
        """Stage 2: the oldest comm group's newest summary time (a group not
        heard from: the job's first record time), at most ``group_hold_ns``
        behind the newest group's."""
        oldest = min(self.groups.get(g, self.first_ns) for g in range(self.group_count))
        return max(oldest, max(self.groups.values()) - self.config.group_hold_ns)

    def advance(
        self,
        engine: TimedEngine,
        source: Callable[[str], Source],
        idle_wall_s: float = 0.0,
        max_evals: int = 0,
        out_of_time: Callable[[], bool] | None = None,
    ) -> list[Any]:
        """Release the records the watermark passed; evaluate; return findings.

        ``idle_wall_s``: wall seconds since the job's last record; past
        ``config.idle_s`` with every stream read to its end the job is quiet
        (module docstring). ``max_evals`` (``0``: no limit) bounds the
        evaluations of one call, and ``out_of_time`` (asked after each
        evaluation) ends it early: a worker catching up on a backlog stops
        there and goes on at its next call, from the same place, so the
        outcome is the same.
        """
        self._out_of_time = out_of_time
        quiet = (
            idle_wall_s >= self.config.idle_s
            and bool(self.streams)
            and all(source(name) == "end" for name in self.streams)
        )
        w = self.watermark(source)
        if quiet:
            w = max(w, self.newest_ns)
        out: list[Any] = []
        budget = max_evals if max_evals > 0 else -1
        self.held = False
        heap = self._heap
        while heap and heap[0][0] <= w:
            t = heap[0][0]
            floor = self._floor()
            if t < floor:
                *_, record = heapq.heappop(heap)
                self.late += 1
                engine.ingest(record, floor)
                continue
            budget = self._evaluate_before(engine, t, out, budget)
            if budget == 0 and self._due(t):
                self.held = True
                return out
            *_, record = heapq.heappop(heap)
            engine.ingest(record, t)
            self.released_ns = t
        if self.released_ns < 0:
            return out
        # Ticks up to the watermark: every record below them is in.
        budget = self._evaluate_before(engine, w, out, budget)
        self.held = budget == 0 and self._due(w)
        news = self.quiet_ns != self.released_ns or self.quiet_late != self.late
        if quiet and not self.held and news:
            out.extend(engine.evaluate(self.next_eval_ns))
            self.next_eval_ns += self.config.cadence_ns
            self.quiet_ns, self.quiet_late = self.released_ns, self.late
        return out

    def finish(self, engine: TimedEngine) -> list[Any]:
        """Release everything; evaluate once past the last record, as
        ``Replay.finish`` does (the quiet rule, without waiting)."""
        return self.advance(engine, lambda _: "end", idle_wall_s=float("inf"))

    def _floor(self) -> int:
        """Oldest time a record may have and still be in order: the newest
        released, or the last evaluated tick, whichever is later."""
        last_tick = self.next_eval_ns - self.config.cadence_ns
        return max(self.released_ns, last_tick if self.next_eval_ns >= 0 else -1)

    def _due(self, t_ns: int) -> bool:
        return 0 <= self.next_eval_ns <= t_ns

    def _evaluate_before(
        self, engine: TimedEngine, t_ns: int, out: list[Any], budget: int
    ) -> int:
        """Run the evaluations due at an event time ``<= t_ns`` (as ``Replay``),
        at most ``budget`` of them (``-1``: all); return the budget left."""
        cfg = self.config
        if self.next_eval_ns < 0:
            self.next_eval_ns = on_grid(t_ns, cfg.cadence_ns)
        if t_ns - self.next_eval_ns > cfg.max_gap_ns:
            end = self.next_eval_ns + cfg.max_gap_ns
            while self.next_eval_ns <= end and budget != 0:
                out.extend(engine.evaluate(self.next_eval_ns))
                self.next_eval_ns += cfg.cadence_ns
                budget = self._spent(budget)
            if budget == 0:
                return 0
            skip = (t_ns - self.next_eval_ns) // cfg.cadence_ns
            self.next_eval_ns += skip * cfg.cadence_ns
            self.skipped_ticks += skip
        while self.next_eval_ns <= t_ns and budget != 0:
            out.extend(engine.evaluate(self.next_eval_ns))
            self.next_eval_ns += self.config.cadence_ns
            budget = self._spent(budget)
        return budget

    def _spent(self, budget: int) -> int:
        """The evaluation budget after one evaluation: one less (``-1``
        stays unlimited), 0 when the caller's time is out."""
        if self._out_of_time is not None and self._out_of_time():
            return 0
        return budget - (budget > 0)
