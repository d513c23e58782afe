"""End to end through the real broker and real Faust worker processes.

Scripted jobs (``tests/unit/core/scenario.py``: 8 ranks, 4 hosts, a fault)
are produced as encoded records; a worker subprocess must publish the
anomalies and one root cause per incident. The kill test SIGKILLs the worker
mid-incident and checks the restarted one neither loses nor repeats it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from mycroft.kafka_client import DLQ_HEADERS, RecordPublisher
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Anomaly, Record, RootCause
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.faust_topics import changelog_topic, ensure_topics
from mycroft.streams.worker_process import WorkerProcess as WorkerProc
from mycroft.topics import TopicSet, partition_for
from tests.unit.core import scenario

pytestmark = pytest.mark.integration
PARTITIONS = 2


@pytest.fixture
def settings(
    kafka_bootstrap: str, unique_name: Callable[..., str], tmp_path: Path
) -> StreamSettings:
    app_id = unique_name("streams-e2e")
    s = StreamSettings(
        kafka_bootstrap,
        app_id=app_id,
        prefix=f"{app_id}.",
        partitions=PARTITIONS,
        evaluate_interval_s=0.1,
        snapshot_interval_s=0.5,
        data_dir=str(tmp_path / "data"),
    )
    ensure_topics(s)
    return s


@pytest.fixture
def workers(
    settings: StreamSettings, tmp_path: Path
) -> Iterator[Callable[[], WorkerProc]]:
    made: list[WorkerProc] = []

    def make() -> WorkerProc:
        w = WorkerProc(settings, tmp_path / f"worker{len(made)}.log")
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()


def job_records(
    job_id: str, kind: str, seconds: float = 10.0
) -> list[tuple[int, Record]]:
    """The scenario's records, renamed to ``job_id``."""
    job = scenario.Job(fault=scenario.Fault(kind, rank=3, at_s=4.0), seconds=seconds)
    job.schedule()
    out = []
    for t, rec in scenario.Emitter(job).records():
        if hasattr(rec, "header"):
            rec.header = type(rec.header)(**{**vars(rec.header), "job_id": job_id})
            out.append((t, rec))
        else:
            out.append((t, type(rec)(**{**vars(rec), "job_id": job_id})))
    return out


def publish(s: StreamSettings, records: list[tuple[int, Record]]) -> None:
    pub = RecordPublisher(s.bootstrap, TopicSet(s.prefix, s.partitions))
    for _, rec in records:
        pub.publish(rec)
    assert pub.flush(30) == 0
    assert pub.stats.failed == 0


class Outputs:
    """Reads the anomaly and root-cause topics from the beginning, decoded."""

    def __init__(self, s: StreamSettings) -> None:
        t = TopicSet(s.prefix, s.partitions)
        self.consumer = Consumer(
            {
                "bootstrap.servers": s.bootstrap,
                "group.id": "unused",
                "enable.auto.commit": False,
            }
        )
        self.consumer.assign(
            [
                TopicPartition(name, p, 0)
                for name in (t.anomaly, t.rootcause)
                for p in range(s.partitions)
            ]
        )
        self.codec = Codec()
        self.records: list[tuple[int, bytes, Anomaly | RootCause]] = []

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in self.consumer.consume(500, 0.2):
                if msg.error() is None:
                    rec = self.codec.decode(msg.value() or b"")
                    assert isinstance(rec, Anomaly | RootCause)
                    self.records.append((msg.partition() or 0, msg.key() or b"", rec))

    def wait_for(
        self, pred: Callable[[list[RootCause]], bool], timeout_s: float
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred(self.root_causes()):
            assert time.monotonic() < deadline, f"timed out; have {self.records}"
            self.poll(0.3)

    def root_causes(self) -> list[RootCause]:
        return [r for _, _, r in self.records if isinstance(r, RootCause)]

    def anomalies(self) -> list[Anomaly]:
        return [r for _, _, r in self.records if isinstance(r, Anomaly)]

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def outputs(settings: StreamSettings) -> Iterator[Outputs]:
    out = Outputs(settings)
    yield out
    out.close()


def test_hang_root_cause_and_dead_letter(
    settings: StreamSettings, workers: Callable[[], WorkerProc], outputs: Outputs
) -> None:
    w = workers()
    w.start()
    publish(settings, job_records("job-a", "gpu-hang"))
    t = TopicSet(settings.prefix, settings.partitions)
    prod = Producer({"bootstrap.servers": settings.bootstrap})
    prod.produce(
        t.state,
        b"garbage, not avro",
        b"job-a",
        partition=partition_for("job-a", settings.partitions),
    )
    prod.flush(10)
    outputs.wait_for(lambda rcs: len(rcs) >= 1, 30)
    outputs.poll(1.0)
    rcs, anomalies = outputs.root_causes(), outputs.anomalies()
    assert {r.incident_id for r in rcs} == {rcs[0].incident_id}
    assert rcs[0].job_id == "job-a" and rcs[0].kind.value == "hang"
    assert any(c.rank == 3 for c in rcs[0].culprits)
    assert anomalies and all(a.job_id == "job-a" for a in anomalies)
    want = partition_for("job-a", settings.partitions)
    assert {(p, k) for p, k, _ in outputs.records} == {(want, b"job-a")}
    assert all(r.emitted_wall_ns > 0 for _, _, r in outputs.records)
    # the garbage record is dead-lettered with its reason, and the worker goes on
    dlq = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "unused"})
    dlq.assign([TopicPartition(t.deadletter, 0, 0)])
    msgs = []
    deadline = time.monotonic() + 15
    while not msgs and time.monotonic() < deadline:
        msgs = [m for m in dlq.consume(10, 0.5) if m.error() is None]
    dlq.close()
    assert msgs and msgs[0].value() == b"garbage, not avro"
    headers = dict(msgs[0].headers() or [])
    assert headers[DLQ_HEADERS[0]] == b"not-avro"
    assert headers[DLQ_HEADERS[2]].startswith(t.state.encode())
    # the windowed rate table of ops per comm was written for every comm, one
    # map per job and window (the scripted completions carry no flows, so
    # rank-chunks stays empty)
    ops = changelog_sums(settings, "comm-ops")
    comms = [*scenario.TP.values(), *scenario.DP.values()]
    assert set(ops) == {"job-a"}
    assert {k for k, v in ops["job-a"].items() if v > 0} == {f"{c:x}" for c in comms}


def changelog_sums(s: StreamSettings, table: str) -> dict[str, dict[str, int]]:
    """Latest ``name -> count`` map of each (key, window) of a windowed rate
    table's changelog, summed over the windows, per key."""
    c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": "unused"})
    c.assign(
        [TopicPartition(changelog_topic(s, table), p, 0) for p in range(s.partitions)]
    )
    latest: dict[str, int] = {}
    deadline, idle = time.monotonic() + 20, 0
    while idle < 3 and time.monotonic() < deadline:
        msgs = [m for m in c.consume(500, 0.5) if m.error() is None]
        idle = 0 if msgs else idle + 1
        for m in msgs:
            latest[(m.key() or b"").decode()] = json.loads(m.value() or b"{}")
    c.close()
    out: dict[str, Counter[str]] = {}
    for raw, counts in latest.items():
        key, _window = json.loads(raw)
        out.setdefault(key, Counter()).update(counts)
    return {key: dict(counts) for key, counts in out.items()}


@pytest.mark.parametrize("after_s", [0.0, 1.2], ids=["at-first-rca", "after-snapshot"])
def test_kill_mid_incident_neither_loses_nor_repeats(
    settings: StreamSettings,
    workers: Callable[[], WorkerProc],
    outputs: Outputs,
    after_s: float,
) -> None:
    records = job_records("job-k", "gpu-hang", seconds=14.0)
    cut = scenario.T0 + 7_000_000_000  # hang at ~4.2 s, detected ~5.7 s
    first = workers()
    first.start()
    publish(settings, [r for r in records if r[0] < cut])
    outputs.wait_for(lambda rcs: len(rcs) >= 1, 30)
    time.sleep(after_s)  # 0: maybe before any snapshot; 1.2: after one (0.5 s period)
    first.kill()
    publish(settings, [r for r in records if r[0] >= cut])
    second = workers()
    second.start()
    if after_s:
        second.wait_log("restored 1 job engine", 20)
    outputs.poll(4.0)
    rcs = outputs.root_causes()
    keys = [(r.incident_id, r.revision) for r in rcs]
    assert len(keys) == len(set(keys)), f"duplicate root causes: {keys}"
    assert len({r.incident_id for r in rcs}) == 1, f"incident split or lost: {keys}"
    ids = [a.anomaly_id for a in outputs.anomalies()]
    assert len(ids) == len(set(ids)), f"duplicate anomalies: {ids}"


def test_two_workers_split_jobs(
    settings: StreamSettings, workers: Callable[[], WorkerProc], outputs: Outputs
) -> None:
    jobs = ["job-a", "job-b", "job-c", "job-d"]
    parts = {partition_for(j, settings.partitions) for j in jobs}
    assert parts == set(range(settings.partitions))  # both partitions are used
    a, b = workers(), workers()
    a.start()
    b.start()
    b.wait_log("Ready", 5)
    publish(settings, [r for j in jobs for r in job_records(j, "gpu-hang")])
    outputs.wait_for(lambda rcs: {r.job_id for r in rcs} == set(jobs), 40)
    rcs = outputs.root_causes()
    assert len({r.incident_id for r in rcs}) == len(jobs)
    keys = [(r.incident_id, r.revision) for r in rcs]
    assert len(keys) == len(set(keys))
    handled = [w.log().count("root cause ") for w in (a, b)]
    assert all(n > 0 for n in handled), f"one worker did all the work: {handled}"
