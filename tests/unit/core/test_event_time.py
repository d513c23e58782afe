"""EventClock: verdicts follow the records, not the order a worker read them."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Callable, Collection
from typing import Any

import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import Anomaly, CommSummary, Record, RootCause
from mycroft.streams.analyze import Replay
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.event_time import (
    EventClock,
    EventTimeConfig,
    Source,
    on_grid,
    record_host,
)
from mycroft.streams.faust_runtime import JobSlot, dump_slot, load_slot, record_time_ns

Verdict = tuple[str, tuple[tuple[int, str, str], ...]]


def _trace(fault: str | None, seed: int, duration: float = 16.0) -> list[Any]:
    cfg = SimConfig(tp=4, pp=2, dp=2, duration_s=duration, seed=seed, job_id="j")
    w = ListWriter()
    simulate(cfg, [parse_spec(fault)] if fault else [], w)
    return w.records


def _verdicts(findings: list[Any]) -> tuple[list[str], dict[str, Verdict]]:
    """Anomaly ids in order, and each incident's latest root cause."""
    anomalies = [f.anomaly_id for f in findings if isinstance(f, Anomaly)]
    causes: dict[str, Verdict] = {}
    for f in findings:
        if isinstance(f, RootCause):
            causes[f.incident_id] = (
                f.kind.value,
                tuple((c.rank, c.component.value, c.kind.value) for c in f.culprits),
            )
    return anomalies, causes


def _offline(records: list[Any]) -> tuple[list[str], dict[str, Verdict]]:
    """What ``mycroft analyze`` finds in the trace."""
    rp = Replay()
    for ts, rec in records:
        rp.feed(ts, rec)
    anomalies, causes = rp.finish()
    return _verdicts([*anomalies, *causes.values()])


def _arrival(records: list[Any], seed: int, skew: int) -> list[tuple[str, Any]]:
    """A worker's read order: each record type's topic is its own queue (one
    host's records stay in order), and the reader takes up to ``skew`` records
    from one topic before switching, at random."""
    queues: dict[str, list[tuple[int, Record]]] = defaultdict(list)
    for ts, rec in records:
        queues[type(rec).__name__].append((ts, rec))
    rng = random.Random(seed)
    out: list[tuple[str, Any]] = []
    heads = {k: 0 for k in queues}
    while any(heads[k] < len(q) for k, q in queues.items()):
        k = rng.choice([k for k, q in queues.items() if heads[k] < len(q)])
        n = rng.randint(1, skew)
        for ts, rec in queues[k][heads[k] : heads[k] + n]:
            out.append((k, (ts, rec)))
        heads[k] = min(len(queues[k]), heads[k] + n)
    return out


def _deadline(every: int) -> Callable[[], bool]:
    """A deadline that passes after every ``every`` evaluations."""
    asked = itertools.count(1)
    return lambda: next(asked) % every == 0


def _live(
    records: list[Any],
    seed: int,
    skew: int,
    every: int,
    restart_at: int | Collection[int] = -1,
    max_evals: int = 0,
    time_out_every: int = 0,
) -> tuple[list[str], dict[str, Verdict]]:
    """Feed the arrival order through an EventClock, advancing every ``every``
    records (a worker's timer), with a snapshot round trip at ``restart_at``
    (one index or several); ``time_out_every``: a deadline that passes after
    every that many evaluations (0: never)."""
    restarts = {restart_at} if isinstance(restart_at, int) else set(restart_at)
    arrival = _arrival(records, seed, skew)
    totals = defaultdict(int)
    for k, _ in arrival:
        totals[k] += 1
    read: dict[str, int] = defaultdict(int)
    clock, engine = EventClock(), Analyzer("j")
    found: list[Any] = []

    def source(name: str) -> Source:
        return "end" if read[name] >= totals[name] else "behind"

    for i, (k, (_, rec)) in enumerate(arrival):
        clock.push(rec, record_time_ns(rec))  # the record's own time, as live
        read[k] += 1
        if i in restarts:
            slot = JobSlot("j", 0, engine, clock=clock)
            back = load_slot(dump_slot(slot), 0, 0.0)[0]
            clock, engine = back.clock, back.engine  # type: ignore[assignment]
        if i % every == 0:
            out_of_time = _deadline(time_out_every) if time_out_every else None
            found += clock.advance(
                engine, source, max_evals=max_evals, out_of_time=out_of_time
            )
    found += clock.finish(engine)
    assert clock.late == 0
    return _verdicts(found)


@pytest.mark.parametrize(
    ("fault", "seed"),
    [
        (None, 3),
        ("gpu-hang:rank=5,at=6", 1),
        ("nic-down:at=6", 2),
        ("gpu-power-cap:at=6", 4),
    ],
)
def test_same_verdicts_whatever_the_read_order(fault: str | None, seed: int) -> None:
    records = _trace(fault, seed)
    offline = _offline(records)
    if fault is not None:
        assert offline[1], "the fault must give a root cause offline"
    for skew, every, evals in [(1, 1, 0), (40, 7, 0), (400, 97, 2)]:
        live = _live(records, seed + skew, skew, every, max_evals=evals)
        assert live == offline, (skew, every, evals)


def test_a_deadline_mid_advance_changes_nothing() -> None:
    """A tick out of time stops the job's advance after an evaluation; the
    next advance goes on from there, to the same verdicts."""
    records = _trace("gpu-hang:rank=5,at=6", 1)
    offline = _offline(records)
    assert _live(records, 4, 40, 7, time_out_every=2) == offline


def test_restart_mid_incident_keeps_the_verdicts() -> None:
    records = _trace("gpu-hang:rank=5,at=6", 1)
    offline = _offline(records)
    n = len(records)
    assert _live(records, 9, 40, 11, restart_at=int(n * 0.6)) == offline


@pytest.mark.parametrize(
    "fault",
    [
        "nic-bandwidth:rank=9,at=5,severity=0.7",
        "pcie-downgrade:at=5",
        "proxy-delay:at=5",
    ],
)
def test_restarts_during_a_slowdown_keep_its_culprits(fault: str) -> None:
    """A snapshot holds what a slowdown's root cause reads (the hosts' flow
    history, the recent collectives), so restarts every ~1 s of a 16 s job,
    one within a second of each root-cause refresh, change nothing."""
    records = _trace(fault, 2)
    offline = _offline(records)
    assert offline[1], "the fault must give a root cause offline"
    n = len(records)
    restarts = range(n // 16, n, n // 16)
    assert _live(records, 5, 40, 11, restart_at=restarts) == offline


def test_canonical_order_is_the_simulators_write_order() -> None:
    records = _trace(None, 5, duration=4.0)
    clock = EventClock()
    for ts, rec in reversed(records):
        clock.push(rec, ts)

    class Log:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def ingest(self, record: Any, now_ns: int) -> None:
            self.seen.append(record)

        def evaluate(self, now_ns: int) -> list[Any]:
            return []

    log = Log()
    clock.finish(log)
    assert [id(r) for r in log.seen] == [id(r) for _, r in records]


class _Counter:
    def __init__(self) -> None:
        self.ingested: list[int] = []
        self.evaluated: list[int] = []

    def ingest(self, record: Any, now_ns: int) -> None:
        self.ingested.append(now_ns)

    def evaluate(self, now_ns: int) -> list[Any]:
        self.evaluated.append(now_ns)
        return []


class _Rec:
    def __init__(self, host: str) -> None:
        self.host = host


class _State(_Rec):
    pass


class _Beat(_Rec):
    pass


_State.__name__, _Beat.__name__ = "StateBatch", "Heartbeat"


S = 1_000_000_000


def test_a_silent_host_holds_the_watermark_only_within_its_bound() -> None:
    cfg = EventTimeConfig()
    clock, eng = EventClock(cfg), _Counter()
    for t in range(0, 10):
        clock.push(_Rec("a"), t * S // 10)
        if t < 3:
            clock.push(_Rec("b"), t * S // 10)
    # One state stream: every record up to 0.2 s behind the newest is out.
    clock.advance(eng, lambda _: "end")
    assert max(eng.ingested) == 9 * S // 10 - cfg.lateness_ns
    assert eng.evaluated == list(range(0, 7 * S // 10 + 1, cfg.cadence_ns))


def test_sparse_stream_holds_while_its_reader_is_behind() -> None:
    cfg = EventTimeConfig()
    clock, eng = EventClock(cfg), _Counter()
    for t in range(0, 80):
        clock.push(_State("a"), t * S // 10)
    clock.push(_Beat("a"), S)
    where: dict[str, Source] = {"StateBatch": "end", "Heartbeat": "behind"}
    clock.advance(eng, lambda n: where.get(n, "end"))
    assert max(eng.ingested) == S - cfg.lateness_ns  # held at the heartbeat
    where["Heartbeat"] = "moving"  # read past what the job produced: all in
    clock.advance(eng, lambda n: where.get(n, "end"))
    assert max(eng.ingested) == 79 * S // 10 - cfg.lateness_ns


def test_a_quiet_job_is_evaluated_once_more_and_not_on_and_on() -> None:
    clock, eng = EventClock(), _Counter()
    clock.push(_Rec("a"), 0)
    clock.push(_Rec("a"), S)
    clock.advance(eng, lambda _: "behind", idle_wall_s=10.0)
    assert eng.evaluated == []  # a reader behind: nothing is known to be in
    clock.advance(eng, lambda _: "end", idle_wall_s=4.0)
    assert eng.ingested == [0, S] and eng.evaluated[-1] == S + S // 10
    for idle in (5.0, 60.0, 3600.0):  # wall time passing changes nothing
        clock.advance(eng, lambda _: "end", idle_wall_s=idle)
    assert eng.evaluated[-1] == S + S // 10
    clock.push(_Rec("a"), 2 * S)  # the job goes on, as in one trace
    clock.finish(eng)
    assert eng.ingested[-1] == 2 * S and clock.late == 0
    assert eng.evaluated == list(range(0, 2 * S + S // 10 + 1, S // 10))


def _summary(group: int, t_ns: int) -> CommSummary:
    return CommSummary("j", group, 3, t_ns, t_ns, 0, 0)


def test_each_comm_group_holds_the_job_stage_watermark() -> None:
    cfg = EventTimeConfig(group_hold_ns=20 * S)
    clock, eng = EventClock(cfg), _Counter()
    for t in range(50):  # groups 0 and 1 at 5 s, group 2 at 1 s
        for g in (0, 1):
            clock.push(_summary(g, t * S // 10), t * S // 10)
        if t <= 10:
            clock.push(_summary(2, t * S // 10), t * S // 10)
    clock.advance(eng, lambda _: "end")  # read to the end: group 2 is behind
    assert max(eng.ingested) == S and eng.evaluated[-1] == S
    for t in range(11, 50):
        clock.push(_summary(2, t * S // 10), t * S // 10)
    clock.advance(eng, lambda _: "end")
    assert max(eng.ingested) == 49 * S // 10 - cfg.lateness_ns
    assert clock.late == 0


def test_a_group_too_far_behind_holds_no_longer() -> None:
    cfg = EventTimeConfig(group_hold_ns=2 * S)
    clock, eng = EventClock(cfg), _Counter()
    for t in range(50):
        clock.push(_summary(0, t * S // 10), t * S // 10)
        clock.push(_summary(1, t * S // 10), t * S // 10)
    clock.push(_summary(2, 0), 0)
    clock.advance(eng, lambda _: "end")
    assert max(eng.ingested) == 29 * S // 10  # 2 s behind the newest group


def test_late_records_after_a_quiet_evaluation_are_evaluated_when_quiet_again() -> None:
    clock, eng = EventClock(), _Counter()
    for t in range(10):
        clock.push(_Rec("a"), t * S // 10)
    clock.advance(eng, lambda _: "end", idle_wall_s=4.0)
    assert eng.ingested[-1] == 9 * S // 10
    evaluated = len(eng.evaluated)
    clock.push(_Rec("b"), 5 * S // 10)  # a lagging producer's record, late
    clock.advance(eng, lambda _: "end", idle_wall_s=0.5)
    assert clock.late == 1 and len(eng.evaluated) == evaluated  # not quiet yet
    clock.advance(eng, lambda _: "end", idle_wall_s=4.0)
    assert len(eng.evaluated) == evaluated + 1
    clock.advance(eng, lambda _: "end", idle_wall_s=60.0)
    assert len(eng.evaluated) == evaluated + 1  # once, not on and on


def test_a_record_behind_an_evaluated_tick_is_late() -> None:
    clock, eng = EventClock(), _Counter()
    clock.push(_Rec("a"), 0)
    clock.push(_Rec("a"), S + S // 20)
    clock.finish(eng)  # evaluates the tick at 1.1 s
    clock.push(_Rec("b"), S + S // 12)  # 1.083 s: after that tick was run
    clock.finish(eng)
    assert clock.late == 1


def test_late_record_is_counted_and_ingested() -> None:
    clock, eng = EventClock(), _Counter()
    for t in range(5):
        clock.push(_Rec("a"), t * S)
    clock.advance(eng, lambda _: "end")
    clock.push(_Rec("b"), S)
    clock.advance(eng, lambda _: "end")
    assert clock.late == 1 and len(eng.ingested) == 5
    assert record_host(_Rec("x")) == "x"


def test_config_rejects_bounds_that_cannot_hold() -> None:
    with pytest.raises(ValueError, match="lateness_ns"):
        EventTimeConfig(lateness_ns=-1)
    with pytest.raises(ValueError, match="cadence_ns"):
        EventTimeConfig(cadence_ns=0)


def test_read_order_matters_without_the_clock() -> None:
    """The property above is not vacuous: the same healthy records folded in
    as read, each stamped with the newest time seen, give a false hang."""
    records = _trace(None, 3)
    engine, found, newest = Analyzer("j"), [], 0
    for _, (ts, rec) in _arrival(records, 4, 1):
        newest = max(newest, ts)
        engine.ingest(rec, newest)
        found += engine.evaluate(newest)
    assert _offline(records) == ([], {})
    assert any(isinstance(f, RootCause) for f in found)


def test_a_jump_of_years_costs_a_bounded_number_of_evaluations() -> None:
    cfg = EventTimeConfig(max_gap_ns=2 * S)
    clock, eng = EventClock(cfg), _Counter()
    clock.push(_State("a"), 0)
    clock.push(_State("a"), 86_400 * 365 * S)  # a clock that jumped a year
    clock.finish(eng)
    assert len(eng.evaluated) <= 2 * S // cfg.cadence_ns + 10
    assert eng.evaluated[-1] % cfg.cadence_ns == 0  # still on the grid
    assert clock.skipped_ticks > 10**8


def test_evaluations_fall_on_the_epoch_grid_whatever_comes_first() -> None:
    """A topology stamped on its host's clock (a few ms off the ticks) read
    first must not shift every evaluation of the job."""
    assert on_grid(1_000_000_007, S // 10) == 1_100_000_000
    assert on_grid(1_100_000_000, S // 10) == 1_100_000_000
    clock, eng = EventClock(), _Counter()
    clock.push(_Rec("a"), 7_000_000)
    clock.push(_Rec("a"), S)
    clock.finish(eng)
    assert eng.evaluated[0] == S // 10
    assert all(t % (S // 10) == 0 for t in eng.evaluated)
