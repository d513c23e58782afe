"""Pure runtime of the stream worker: clocks, routing, snapshots, dedup, rates."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import (
    Anomaly,
    CommSummary,
    Heartbeat,
    Record,
    RootCause,
    StateBatch,
)
from mycroft.schemas.vocab import FaultKind
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.event_time import Source
from mycroft.streams.faust_runtime import (
    Finding,
    JobRouter,
    JobSlot,
    add_counts,
    comm_ops,
    dump_changed,
    dump_slot,
    is_fresh,
    load_slot,
    mark_sent,
    next_first,
    rank_chunks,
    record_job,
    record_time_ns,
    turns,
)
from tests.unit.core.scenario import make
from tests.unit.samples import T0, all_records, completion_batch, state_batch


@dataclass
class FakeEngine:
    """Emits an anomaly and a root-cause revision per marked batch."""

    job_id: str
    seen: list[int] = field(default_factory=list)
    revision: int = -1

    def ingest(self, record: Record, now_ns: int) -> None:
        if isinstance(record, StateBatch):
            self.seen.append(record.header.agent_seq)

    def evaluate(self, now_ns: int) -> Sequence[Finding]:
        if not self.seen or self.seen[-1] != 99:
            return []
        self.revision += 1
        a = Anomaly(
            f"a{self.revision}",
            self.job_id,
            FaultKind.HANG,
            (1,),
            (3,),
            T0,
            now_ns,
            "fake",
            "stuck",
        )
        rc = RootCause(
            "inc-1",
            self.revision,
            self.job_id,
            FaultKind.HANG,
            (),
            (),
            (a.anomaly_id,),
            T0,
            now_ns,
            now_ns,
        )
        return [a, rc]


def test_record_job_and_time() -> None:
    recs = all_records()
    assert {record_job(r) for r in recs} == {"job-1"}
    assert record_time_ns(state_batch(3)) == T0 + 300_000_000
    assert all(record_time_ns(r) >= T0 for r in recs)


def _end(_: str) -> Source:
    return "end"


def _behind(_: str) -> Source:
    return "behind"


def test_records_reach_the_engine_once_the_watermark_passed_them() -> None:
    slot = JobSlot("j", 0, FakeEngine("j"))
    for seq in range(5):
        slot.ingest(state_batch(seq), wall_s=10.0, produced_s=100.0 + seq)
    assert slot.produced_s == 104.0 and slot.trace_ns == T0 + 400_000_000
    slot.advance(_behind, wall_s=10.0)  # a reader behind: nothing is known to be in
    assert slot.engine.seen == []  # type: ignore[attr-defined]
    slot.advance(_end, wall_s=10.0)  # read to the end: all but the last 0.2 s
    assert slot.engine.seen == [0, 1, 2]  # type: ignore[attr-defined]


def test_a_quiet_job_is_evaluated_once_more_also_after_a_restore() -> None:
    """No records and every partition read: the records still held are
    released and one more tick is evaluated, as at the end of a trace; wall
    time passing (downtime, a restore) adds nothing."""
    router = JobRouter(FakeEngine)
    slot = router.slot("j", 0)
    slot.ingest(state_batch(0), wall_s=10.0)
    slot.advance(_end, wall_s=11.0)
    assert slot.clock.next_eval_ns == -1  # within lateness: nothing released
    slot.advance(_end, wall_s=14.0)  # quiet for 4 s
    assert slot.clock.released_ns == T0 and slot.clock.next_eval_ns == T0 + 200_000_000
    router.drop([0])
    assert router.restore([("j", dump_slot(slot))], 0, wall_s=50.0) == 1
    back = router.slots["j"]
    back.advance(_end, wall_s=500.0)
    assert back.clock.next_eval_ns == T0 + 200_000_000


def test_a_job_restored_after_its_last_record_turns_quiet() -> None:
    """Its last records were taken in before the snapshot, so none is read
    after the restore: the restore dates it, and once every partition is
    read and ``idle_s`` passed, what it holds is released and evaluated."""
    router = JobRouter(FakeEngine)
    slot = router.slot("j", 0)
    slot.ingest(state_batch(0), wall_s=10.0)
    slot.advance(_end, wall_s=11.0)
    assert slot.clock.next_eval_ns == -1  # within lateness: nothing released
    router.drop([0])
    assert router.restore([("j", dump_slot(slot))], 0, wall_s=50.0) == 1
    back = router.slots["j"]
    back.advance(_end, wall_s=51.0)  # restored 1 s ago
    assert back.clock.next_eval_ns == -1
    back.advance(_end, wall_s=54.0)  # quiet for 4 s since the restore
    assert back.clock.released_ns == T0 and back.clock.next_eval_ns == T0 + 200_000_000


def test_router_groups_jobs_by_partition_and_drops_revoked() -> None:
    router = JobRouter(FakeEngine)
    a, b = router.slot("a", 0), router.slot("b", 1)
    assert router.slot("a", 0) is a
    assert router.on_partition(0) == [a] and router.on_partition(1) == [b]
    router.drop([0])
    assert list(router.slots) == ["b"]


def test_idle_jobs_of_a_partition_are_evicted() -> None:
    router = JobRouter(FakeEngine)
    old, fresh, other = (
        router.slot("old", 0),
        router.slot("fresh", 0),
        router.slot("o", 1),
    )
    old.observe(T0, wall_s=10.0)
    fresh.observe(T0, wall_s=100.0)
    other.observe(T0, wall_s=10.0)
    assert router.evict_idle(0, wall_s=150.0, idle_s=120.0) == ["old"]
    assert sorted(router.slots) == ["fresh", "o"]  # other partitions untouched


def test_a_job_still_reading_older_records_is_not_evicted() -> None:
    """Behind on its completions, a worker reads a job's older records long
    after its state records reached the job's end: the clock stands still,
    the job is not idle."""
    router = JobRouter(FakeEngine)
    slot = router.slot("j", 0)
    slot.ingest(state_batch(600), wall_s=10.0)  # tick 60 s into the job
    slot.ingest(completion_batch(), wall_s=140.0)  # its first tick
    assert slot.trace_ns == T0 + 60_000_000_000  # the late record did not move it
    assert router.evict_idle(0, wall_s=150.0, idle_s=120.0) == []
    assert router.evict_idle(0, wall_s=261.0, idle_s=120.0) == ["j"]


def test_a_snapshot_over_the_record_limit_is_held_back_not_sent() -> None:
    """A snapshot the producer would refuse (which stops the worker) is
    returned as a size; its slot stays changed for the next snapshot."""
    rng = np.random.default_rng(0)
    small = JobSlot("small", 0, FakeEngine("small", seen=[1]))
    big = JobSlot(
        "big", 0, FakeEngine("big", seen=rng.integers(0, 2**62, 4000).tolist())
    )
    quiet = JobSlot("quiet", 0, FakeEngine("quiet"), dirty=False)
    blobs, too_big = dump_changed([small, big, quiet], limit=10_000)
    assert list(blobs) == ["small"]
    assert load_slot(blobs["small"], 0, 0.0, factory=FakeEngine)[0].job_id == "small"
    assert list(too_big) == ["big"] and too_big["big"] > 10_000
    assert big.dirty and not small.dirty


def test_snapshot_roundtrip_keeps_records_not_released_yet() -> None:
    slot = JobSlot("j", 1, FakeEngine("j", seen=[1, 2]))
    slot.ingest(state_batch(7), wall_s=100.0)
    back, _ = load_slot(dump_slot(slot), 1, wall_s=5.0, factory=FakeEngine)
    assert back.trace_ns == slot.trace_ns and back.clock.pending == 1
    assert isinstance(back.engine, FakeEngine) and back.engine.seen == [1, 2]
    back.clock.finish(back.engine)
    assert back.engine.seen == [1, 2, 7]


def test_restore_once_per_assignment_and_never_over_live_engines() -> None:
    live = JobSlot("live", 0, FakeEngine("live", seen=[7]))
    blobs = [
        ("old", dump_slot(JobSlot("old", 0, FakeEngine("old", seen=[1])))),
        ("live", dump_slot(JobSlot("live", 0, FakeEngine("live")))),
    ]
    router = JobRouter(FakeEngine, slots={"live": live})
    assert router.restore(blobs, 0, 1.0) == 1
    assert router.slots["live"] is live
    assert router.restore(blobs, 0, 1.0) == 0  # already loaded
    router.drop([0])
    assert router.restore(blobs, 0, 1.0) == 2  # reassigned: reload


def test_dedup_one_root_cause_per_revision_and_anomaly_once() -> None:
    engine = FakeEngine("j", seen=[99])
    state: dict[str, object] | None = None
    sent: list[Finding] = []
    findings = list(engine.evaluate(T0)) + list(engine.evaluate(T0 + 1))
    replay = FakeEngine("j", seen=[99])  # a restored engine re-emits the same
    findings += list(replay.evaluate(T0 + 2))
    for f in findings:
        if is_fresh(state, f):
            sent.append(f)
            state = mark_sent(state, f)
    keys = [(f.incident_id, f.revision) for f in sent if isinstance(f, RootCause)]
    assert keys == [("inc-1", 0), ("inc-1", 1)]
    assert [f.anomaly_id for f in sent if isinstance(f, Anomaly)] == ["a0", "a1"]


def test_dedup_state_is_json_and_bounded() -> None:
    state = None
    for i in range(3000):
        state = mark_sent(
            state, Anomaly(f"a{i}", "j", FaultKind.HANG, (), (), 0, 0, "d", "")
        )
    assert state is not None and len(state["anomalies"]) == 2048
    assert not is_fresh(
        state, Anomaly("a2999", "j", FaultKind.HANG, (), (), 0, 0, "d", "")
    )


def test_rates_from_completion_batch() -> None:
    batch = completion_batch()
    assert rank_chunks([batch]) == {0: 64, 1: 64}
    assert comm_ops([batch]) == {int(batch.op["comm"][0]): 1}
    empty = completion_batch()
    empty.op = empty.op[:0]
    assert rank_chunks([empty]) == {} and comm_ops([empty]) == {}
    assert rank_chunks([]) == {} and comm_ops([]) == {}
    # Several batches: chunks add up; each batch counts its own distinct ops
    # (one host's view), a batch whose flows do not match its ops is left out.
    broken = completion_batch()
    broken.flow = broken.flow[:1]
    assert rank_chunks([batch, empty, broken, batch]) == {0: 128, 1: 128}
    assert comm_ops([batch, empty, batch]) == {int(batch.op["comm"][0]): 2}


def test_comm_ops_counts_distinct_ops_per_comm() -> None:
    rng = np.random.default_rng(3)
    batch = completion_batch()
    comms = np.array([5, (1 << 64) - 1, 1 << 63], np.uint64)
    op = np.resize(batch.op, 200)
    op["comm"] = comms[rng.integers(0, 3, 200)]
    op["seq"] = rng.integers(0, 40, 200)
    batch.op = op
    naive: dict[int, set[int]] = {}
    for c, q in zip(op["comm"].tolist(), op["seq"].tolist(), strict=True):
        naive.setdefault(c, set()).add(q)
    assert comm_ops([batch]) == {c: len(q) for c, q in naive.items()}


def test_rate_window_values_add_up_without_changing_their_input() -> None:
    window = {"0": 64, "3": 10}
    assert add_counts(window, {"3": 5, "7": 1}) == {"0": 64, "3": 15, "7": 1}
    assert window == {"0": 64, "3": 10}  # a table's value is replaced, not edited
    assert add_counts({}, {}) == {}


@pytest.mark.parametrize("seq", [0, 5])
def test_state_batch_rows_are_records(seq: int) -> None:
    assert len(state_batch(seq).rc) == 8


def _stalling_worker(records, drop_host: str = "") -> list[Finding]:
    """Drive a real ``JobSlot`` + ``Analyzer`` as the worker does: the wall
    clock freezes 1.5 s every 100 records (about 2.5 s of trace: GC, a slow
    sink, a rebalance), then the backlog is read at full speed; evaluations
    run every 0.2 s of wall time."""
    t0 = records[0][0]
    paced: list[tuple[float, Record]] = []
    wall = 0.0
    for i, (ts, rec) in enumerate(records):
        host = getattr(getattr(rec, "header", None), "host", getattr(rec, "host", ""))
        if host == drop_host and ts - t0 > 6_000_000_000:
            continue  # this host is gone from 6 s on
        wall = max(wall, (ts - t0) / 1e9) + (1.5 if i % 100 == 99 else 0.001)
        paced.append((wall, rec))
    return _drive(paced)


def _drive(paced: list[tuple[float, Record]]) -> list[Finding]:
    """Feed ``(wall_s, record)`` to one job slot, advancing every 0.2 s (the
    worker's tick; every record written so far is read)."""
    slot = JobSlot("j", 0, Analyzer("j"))
    found: list[Finding | CommSummary] = []
    next_eval = 0.0
    for wall, rec in paced:
        slot.ingest(rec, wall)
        while next_eval <= wall:
            found += slot.advance(_end, wall)
            next_eval += 0.2
    found += slot.advance(_end, wall + 10.0)
    return [f for f in found if not isinstance(f, CommSummary)]


def test_worker_stalls_are_not_silence_of_the_job() -> None:
    """A worker that falls behind reads every host late but in order: no host
    is lost. A host that really stops is still found by the same worker."""
    out = ListWriter()
    simulate(SimConfig(tp=4, pp=2, dp=2, duration_s=10.0, seed=3), [], out)
    healthy = _stalling_worker(out.records)
    assert [f for f in healthy if isinstance(f, Anomaly)] == []
    dead = _stalling_worker(out.records, drop_host="node0001")
    silent = {
        r for f in dead if isinstance(f, Anomaly) and f.detector == "silence"
        for r in f.ranks
    }  # fmt: skip
    assert silent and silent <= set(range(8, 16))


def test_snapshot_holds_the_whole_engine() -> None:
    """A snapshot keeps the slots, baselines, partial completions, each
    host's flow history (with its index of started sends) and the recent
    collectives: what a root cause after the restore reads."""
    out = ListWriter()
    simulate(SimConfig(tp=4, pp=2, dp=2, duration_s=6.0, seed=3), [], out)
    slot = JobSlot("j", 0, Analyzer("j"))
    engine = slot.engine
    assert isinstance(engine, Analyzer)
    # Most records joined and observed; the last ones still queued (joined
    # and observed only after the restore).
    part = len(out.records) * 3 // 4
    for ts, rec in out.records[:part]:
        engine.ingest(rec, ts)
    engine.detect(out.records[part][0])
    for ts, rec in out.records[part:]:
        engine.ingest(rec, ts)
    assert engine.tracker.queued_rows
    back = load_slot(dump_slot(slot), 0, 1.0)[0].engine
    assert isinstance(back, Analyzer)
    assert any(len(h.history) for h in engine.ctx.store.hosts.values())
    for name, host in engine.ctx.store.hosts.items():
        again = back.ctx.store.hosts[name]
        assert len(again.history) == len(host.history)
        pairs = zip(again.history, host.history, strict=True)
        assert all((a == b).all() for a, b in pairs)
        assert [(t, sorted(d)) for t, d in again.sends] == [
            (t, sorted(d)) for t, d in host.sends
        ]
    newest = max(int(s.end_ns.max()) for s in engine.stats)
    assert len(back.stats) == len(engine.stats)
    assert (back.ctx.store.slots == engine.ctx.store.slots).all()
    for an in (engine, back):  # observe the queued collectives, then compare
        an.detect(newest)
    first = engine.stats.since(0)[0]
    late = (first.comm, int(first.ranks[0]), "late")
    for key in (next(iter(engine.ctx.book._book)), late):
        restored = back.ctx.book.find(key)
        assert restored is not None
        assert restored.stats() == engine.ctx.book.get(key).stats()


def _beats_ahead(fault: str) -> list[Finding]:
    """A worker that reads the heartbeat topic 3 s ahead of the state and
    completion topics (separate fetch positions, a backlog on the big ones)."""
    out = ListWriter()
    faults = [parse_spec(fault)] if fault else []
    simulate(SimConfig(tp=4, pp=2, dp=2, duration_s=14.0, seed=2), faults, out)
    ahead = sorted(
        out.records,
        key=lambda r: r[0] - (3_000_000_000 if isinstance(r[1], Heartbeat) else 0),
    )
    t0 = ahead[0][0]
    return _drive([((ts - t0) / 1e9, rec) for ts, rec in ahead])


def test_heartbeats_read_ahead_of_state_do_not_age_the_hosts() -> None:
    """Heartbeats come on their own topic: read ahead of the state backlog
    they must not make rows look vanished, comms stalled or batches stale."""
    assert [f for f in _beats_ahead("") if isinstance(f, Anomaly)] == []
    causes = [
        f for f in _beats_ahead("gpu-hang:rank=5,at=6") if isinstance(f, RootCause)
    ]
    assert causes and causes[-1].culprits[0].rank == 5
    assert causes[-1].culprits[0].component.value == "gpu"


@dataclass
class _Held:
    """A job with ``backlog`` steps to go: held until they are done."""

    backlog: int
    steps: int = 0

    @property
    def held(self) -> bool:
        return self.steps < self.backlog


@dataclass
class _Slot:
    clock: _Held
    job_id: str = "j"


def test_a_flooding_job_gets_no_more_turns_than_the_others() -> None:
    flood, small, idle = _Slot(_Held(10**6)), _Slot(_Held(3)), _Slot(_Held(0))
    order, budget = [], 12

    def out_of_time() -> bool:
        return len(order) >= budget

    for slot in turns([flood, small, idle], out_of_time):  # type: ignore[list-item]
        slot.clock.steps += 1
        order.append(slot)
    assert order.count(idle) == 1  # every job gets its first step
    assert order.count(small) == 3  # the small job's backlog is done
    assert order.count(flood) == budget - 4  # the flood only uses what is left
    assert order[:3] == [flood, small, idle]  # rounds, not one job to its end


def test_a_tick_short_of_time_serves_the_others_first_next_time() -> None:
    """With more jobs than one tick's budget, a tick stops mid-round and the
    next one starts with the first job it did not serve: every job is
    served within a few ticks, and no tick runs past its budget."""
    slots = [_Slot(_Held(10**6), f"j{i}") for i in range(7)]
    first: str | None = None
    seen: list[list[str]] = []
    for _ in range(3):
        order: list[str] = []
        three = functools.partial(lambda done: len(done) >= 3, order)
        for slot in turns(slots, three, first):  # type: ignore[arg-type]
            order.append(slot.job_id)
        seen.append(order)
        first = next_first(slots, set(order), first)  # type: ignore[arg-type]
    assert seen == [["j0", "j1", "j2"], ["j3", "j4", "j5"], ["j6", "j0", "j1"]]
    order = []
    for slot in turns(slots, lambda: True, None):  # type: ignore[arg-type]
        order.append(slot.job_id)
    assert order == ["j0"]  # out of time at once: still one step
    served = {s.job_id for s in slots}
    assert next_first(slots, served, "j3") is None  # type: ignore[arg-type]


class _Counting(Analyzer):
    """An analyzer that counts the records handed to it."""

    taken_in = 0

    def ingest(self, record: Record, now_ns: int) -> None:
        self.taken_in += 1
        super().ingest(record, now_ns)


def _take(slot: JobSlot, records: list, start: int) -> None:
    """Feed ``records`` from offset ``start`` as the worker's ``on_record`` does."""
    for offset, (_, record) in enumerate(records[start:], start):
        if not slot.holds("raw", 0, offset):
            slot.ingest(record, wall_s=0.0)
            slot.took("raw", 0, offset)


def _causes(findings: list) -> list[tuple[str, list[tuple[int, str]]]]:
    return [
        (f.incident_id, [(c.rank, c.component.value) for c in f.culprits])
        for f in findings
        if isinstance(f, RootCause)
    ]


def test_records_read_again_after_a_restart_are_taken_in_once() -> None:
    records = make("gpu-hang", 3)
    once = JobSlot("job1", 0, _Counting("job1"))
    _take(once, records, 0)
    expected = _causes(once.clock.finish(once.engine))
    assert expected, "the scripted hang has a root cause"
    # The worker wrote a snapshot at offset 300 but its last commit was at
    # 120: after a kill it restores the snapshot and reads from 121 again.
    first = JobSlot("job1", 0, _Counting("job1"))
    _take(first, records[:301], 0)
    back, _ = load_slot(dump_slot(first), 0, wall_s=0.0, factory=_Counting)
    _take(back, records, 121)
    assert back.taken == {("raw", 0): len(records) - 1}
    assert _causes(back.clock.finish(back.engine)) == expected
    assert back.engine.taken_in == once.engine.taken_in == len(records)
