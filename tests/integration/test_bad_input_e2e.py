"""Wrong records through the real broker and a real worker process.

A scripted hanging job is produced with valid-Avro-but-wrong records mixed
in (``tests/unit/core/bad_records.py``), plus null values: the worker must
name the same culprit, dead-letter each wrong record with its contract
reason, count them in ``mycroft_invalid_records_total`` on its metrics port,
take a topology tombstone as a host leaving, and never crash.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from mycroft.kafka_client import DLQ_HEADERS
from mycroft.schemas.records import CompletionBatch, StateBatch
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.faust_topics import ensure_topics
from mycroft.streams.worker_process import WorkerProcess
from mycroft.topics import TopicSet, partition_for
from tests.integration.test_streams_e2e import Outputs, job_records, publish
from tests.unit.core import bad_records as bad
from tests.unit.core.scenario import T0

pytestmark = pytest.mark.integration
JOB = "job-bad"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def settings(
    kafka_bootstrap: str, unique_name: Callable[..., str], tmp_path: Path
) -> StreamSettings:
    app_id = unique_name("streams-bad")
    s = StreamSettings(
        kafka_bootstrap,
        app_id=app_id,
        prefix=f"{app_id}.",
        partitions=2,
        evaluate_interval_s=0.1,
        snapshot_interval_s=0.5,
        stats_interval_s=1.0,
        data_dir=str(tmp_path / "data"),
        metrics_port=_free_port(),
    )
    ensure_topics(s)
    return s


@pytest.fixture
def worker(settings: StreamSettings, tmp_path: Path) -> Iterator[WorkerProcess]:
    w = WorkerProcess(settings, tmp_path / "worker.log")
    w.start()
    yield w
    w.stop()


def _first(records, kind, host, after_ns):
    return next(
        r
        for t, r in records
        if isinstance(r, kind) and r.header.host == host and t >= after_ns and len(r.op)
    )


def _wrong_records(records) -> list:
    """One wrong record per category the issue names, from the culprit's
    host (h1) and a healthy one (h2), mid-hang."""
    mid = T0 + 4_500_000_000
    state = _first(records, StateBatch, "h1", mid)
    done = _first(records, CompletionBatch, "h2", mid - 2_000_000_000)
    minus = bad.bad_rank(done, 10**6, -1)
    minus.op["rank"][:] = -1
    beyond = bad.bad_rank(state, 10**6 + 1, 119)
    beyond.op["rank"][:] = 119
    return [
        minus,
        bad.bad_tick(state, 10**6 + 2, bad.I64.max),
        bad.bad_tick(_first(records, StateBatch, "h2", mid), 10**6 + 3, 1_000),
        beyond,
        bad.empty_state(state, 10**6 + 4, 0),
        bad.bad_counters(state, 10**6 + 5, -3),
    ]


def _dead_letters(s: StreamSettings, want: int, timeout_s: float) -> list:
    t = TopicSet(s.prefix, s.partitions)
    c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": "unused"})
    c.assign(
        [TopicPartition(t.deadletter, p, 0) for p in range(t.partitions("dlq.raw"))]
    )
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        out += [m for m in c.consume(50, 0.5) if m.error() is None]
    c.close()
    return out


def test_wrong_records_are_dead_lettered_counted_and_never_name_a_culprit(
    settings: StreamSettings, worker: WorkerProcess
) -> None:
    records = job_records(JOB, "gpu-hang")
    wrong = [
        (0, replace(r, header=replace(r.header, job_id=JOB)))
        for r in _wrong_records(records)
    ]
    cut = T0 + 4_500_000_000
    publish(settings, [r for r in records if r[0] < cut])
    publish(settings, wrong)
    t = TopicSet(settings.prefix, settings.partitions)
    prod = Producer({"bootstrap.servers": settings.bootstrap})
    p = partition_for(JOB, settings.partitions)
    prod.produce(t.state, None, JOB.encode(), partition=p)  # a null value
    prod.produce(t.topology, None, f"{JOB}/h9".encode(), partition=p)  # host left
    prod.flush(10)
    publish(settings, [r for r in records if r[0] >= cut])
    out = Outputs(settings)
    try:
        out.wait_for(lambda rcs: len(rcs) >= 1, 40)
        out.poll(2.0)
        rcs = out.root_causes()
    finally:
        out.close()
    assert {r.incident_id for r in rcs} == {rcs[0].incident_id}
    assert rcs[0].culprits[0].rank == 3 and rcs[0].kind.value == "hang"
    assert {c.rank for r in rcs for c in r.culprits} <= set(range(8))
    msgs = _dead_letters(settings, 7, 30)
    reasons = {dict(m.headers() or [])[DLQ_HEADERS[0]].decode() for m in msgs}
    assert reasons >= {
        "null-value",
        "rank-out-of-range",
        "time-out-of-range",
        "empty-state",
        "counter-order",
    }, reasons
    url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()  # noqa: S310
    counted = {
        line.split('reason="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("mycroft_invalid_records_total{")
    }
    assert counted >= {"rank-out-of-range", "time-out-of-range", "empty-state"}
    assert 'mycroft_tombstones_total{topic="' in text
    worker_stats = {
        name: float(value)
        for name, value in (
            line.split(" ", 1) for line in text.splitlines() if not line.startswith("#")
        )
        if name.startswith("mycroft_worker_")
    }
    assert worker_stats["mycroft_worker_jobs"] >= 1
    assert worker_stats["mycroft_worker_rank_state_rows_total"] > 0
    assert 0 <= worker_stats["mycroft_worker_record_lag_seconds"] < 60
    log = worker.log()
    assert "Traceback" not in log and "host h9 left job" in log
