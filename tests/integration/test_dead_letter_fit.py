"""A record too big for the dead-letter topic goes there cut, never crashing.

Through the real broker: a 1,000,000-row state batch (31 MB encoded, a few
MB on the wire with lz4) that the worker must reject, once for its time
(dead-lettered as it came) and once for its rows (re-encoded rejected rows):
neither fits the dead-letter topic's 1 MB, both arrive cut to fit with their
size, reason and source in headers, and the worker goes on to name the
culprit of the job around them. The decoding consumer the sinks use does the
same with an undecodable 3 MB value.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported, missing from the stubs
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from confluent_kafka.cimpl import NewTopic

from mycroft import dead_letters
from mycroft.kafka_client import DecodingConsumer, create_missing
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import StateBatch
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.faust_topics import ensure_topics
from mycroft.streams.worker_process import WorkerProcess
from mycroft.topics import TopicSet, partition_for
from tests.integration.test_streams_e2e import Outputs, job_records, publish
from tests.unit.core import bad_records as bad
from tests.unit.core.scenario import T0

pytestmark = pytest.mark.integration
JOB = "job-big"
ROWS = 1_000_000
BIG_MESSAGE = str(64 << 20)


def _read_all(bootstrap: str, topic: str, want: int, timeout_s: float) -> list[Message]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    meta = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        out += [m for m in c.consume(50, 0.5) if m.error() is None]
    c.close()
    return out


def _big_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4",
                     "message.max.bytes": BIG_MESSAGE})  # fmt: skip


def _allow_big(bootstrap: str, topic: str) -> None:
    """Let ``topic`` take the big batch (the broker's default is 1 MB)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(
        "max.message.bytes", BIG_MESSAGE,
        incremental_operation=AlterConfigOpType.SET,
    )  # fmt: skip
    res = ConfigResource("topic", topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([res]).values():
        future.result(30)


def _headers(msg: Message) -> dict[str, bytes]:
    pairs: list[tuple[str, bytes]] = list(msg.headers() or [])  # type: ignore[arg-type]  # values are bytes on the wire
    return dict(pairs)


def _check_cut(msg: Message, reason: str, source_prefix: str) -> int:
    headers = _headers(msg)
    value = msg.value() or b""
    size = int(headers[dead_letters.SIZE])
    assert headers[dead_letters.TRUNCATED] == b"1"
    assert size > dead_letters.MAX_BYTES and len(value) < dead_letters.MAX_BYTES
    assert headers[dead_letters.REASON].decode() == reason
    assert headers[dead_letters.SOURCE].decode().startswith(source_prefix)
    return size


def test_the_decoding_consumer_cuts_an_undecodable_3_mb_value(
    kafka_bootstrap: str, unique_name: Callable[..., str]
) -> None:
    source, dlq = unique_name("big-src"), unique_name("big-dlq")
    create_missing(kafka_bootstrap, [NewTopic(source, 1, 1), NewTopic(dlq, 1, 1)])
    _allow_big(kafka_bootstrap, source)
    producer = _big_producer(kafka_bootstrap)
    producer.produce(source, os.urandom(3_000_000), b"job/host")
    assert producer.flush(30) == 0
    consumer = DecodingConsumer(kafka_bootstrap, unique_name("g"), [source], dlq)
    try:
        deadline = time.monotonic() + 30
        while consumer.stats.dead_lettered == 0 and time.monotonic() < deadline:
            consumer.poll(0.5)
        consumer.commit()
    finally:
        consumer.close()
    (msg,) = _read_all(kafka_bootstrap, dlq, 1, 20)
    assert _check_cut(msg, "not-avro", f"{source}[0]@0") == 3_000_000
    assert msg.key() == b"job/host"


@pytest.fixture
def settings(
    kafka_bootstrap: str, unique_name: Callable[..., str], tmp_path: Path
) -> StreamSettings:
    app_id = unique_name("streams-big")
    s = StreamSettings(
        kafka_bootstrap, app_id=app_id, prefix=f"{app_id}.", partitions=2,
        evaluate_interval_s=0.1, snapshot_interval_s=0.5,
        data_dir=str(tmp_path / "data"),
    )  # fmt: skip
    ensure_topics(s)
    _allow_big(kafka_bootstrap, TopicSet(s.prefix, s.partitions).state)
    return s


@pytest.fixture
def worker(settings: StreamSettings, tmp_path: Path) -> Iterator[WorkerProcess]:
    w = WorkerProcess(settings, tmp_path / "worker.log")
    w.start()
    yield w
    w.stop()


def _million_rows(state: StateBatch, seq: int) -> StateBatch:
    """``state`` with its flow rows repeated to a million."""
    flows = np.tile(state.flow, ROWS // len(state.flow) + 1)[:ROWS]
    h = replace(state.header, agent_seq=seq)
    return StateBatch(h, state.rc.copy(), state.op.copy(), flows)


def test_a_million_row_batch_the_worker_rejects_is_cut_to_fit(
    settings: StreamSettings, worker: WorkerProcess
) -> None:
    records = job_records(JOB, "gpu-hang")
    mid = T0 + 4_500_000_000
    state = next(
        r for t, r in records
        if isinstance(r, StateBatch) and r.header.host == "h1" and t >= mid
        and len(r.op) and len(r.flow)
    )  # fmt: skip
    late = bad.bad_tick(_million_rows(state, 10**6), 10**6, bad.I64.max)
    peers = _million_rows(state, 10**6 + 1)
    peers.flow["peer"][:] = 119  # every row names a rank outside the job
    publish(settings, [r for r in records if r[0] < mid])
    t = TopicSet(settings.prefix, settings.partitions)
    producer = _big_producer(settings.bootstrap)
    p = partition_for(JOB, settings.partitions)
    for big in (late, peers):
        value = Codec().encode(big)
        producer.produce(t.state, value, f"{JOB}/h1".encode(), partition=p)
    assert producer.flush(60) == 0
    publish(settings, [r for r in records if r[0] >= mid])
    out = Outputs(settings)
    try:
        out.wait_for(lambda rcs: len(rcs) >= 1, 60)
        rcs = out.root_causes()
    finally:
        out.close()
    assert rcs[0].culprits[0].rank == 3
    cut = [
        m
        for m in _read_all(settings.bootstrap, t.deadletter, 2, 30)
        if dead_letters.TRUNCATED in _headers(m)
    ]
    reasons = {_headers(m)[dead_letters.REASON].decode() for m in cut}
    assert "time-out-of-range" in reasons and len(cut) == 2, reasons
    for m in cut:
        assert int(_headers(m)[dead_letters.SIZE]) > 10_000_000
    log = worker.log()
    assert "Traceback" not in log and "crashed" not in log.lower(), log[-3000:]
