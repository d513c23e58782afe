"""Every record type through a real broker, and bad input to the dead letters."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer

from mycroft.kafka_client import (
    DLQ_HEADERS,
    DecodingConsumer,
    RecordPublisher,
    create_topics,
)
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Record
from mycroft.topics import TopicSet, partition_for
from tests.unit.samples import all_records

pytestmark = pytest.mark.integration


def _comparable(record: Record) -> object:
    return {
        k: v.tolist() if isinstance(v, np.ndarray) else v
        for k, v in vars(record).items()
    }


def _drain(consumer: DecodingConsumer, want: int, timeout_s: float = 30.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.poll(timeout_s=0.5)
    return got


@pytest.fixture
def topics(kafka_bootstrap: str, unique_name: Callable[..., str]) -> TopicSet:
    topics = TopicSet(unique_name("rt") + ".", partitions=2)
    created = create_topics(kafka_bootstrap, topics)
    assert len(created) == len(topics.specs)
    assert create_topics(kafka_bootstrap, topics) == []  # idempotent
    return topics


def test_every_record_type_round_trips_through_kafka(
    kafka_bootstrap: str, topics: TopicSet, unique_name: Callable[..., str]
) -> None:
    records = all_records()
    publisher = RecordPublisher(kafka_bootstrap, topics)
    for r in records:
        publisher.publish(r)
    assert publisher.flush(30) == 0
    assert publisher.stats.delivered == len(records)
    assert publisher.stats.failed == 0

    names = [topics.for_record(type(r).__name__) for r in records]
    consumer = DecodingConsumer(
        kafka_bootstrap, unique_name("g"), names, topics.deadletter
    )
    try:
        got = _drain(consumer, len(records))
    finally:
        consumer.close()
    by_type = {type(rec).__name__: (msg, rec) for msg, rec in got}
    assert set(by_type) == {type(r).__name__ for r in records}
    for r in records:
        msg, back = by_type[type(r).__name__]
        assert _comparable(back) == _comparable(r)
        assert msg.partition() == partition_for("job-1", 2)
    assert by_type["Topology"][0].key() == b"job-1/host-0"
    assert by_type["StateBatch"][0].key() == b"job-1"


def test_undecodable_records_go_to_the_dead_letter_topic_and_consumption_goes_on(
    kafka_bootstrap: str, topics: TopicSet, unique_name: Callable[..., str]
) -> None:
    good = Codec().encode(all_records()[0])
    bad = {
        b"not-avro": b"plain text",
        b"unknown": b"\xc3\x01" + b"\x07" * 8 + b"\x00",
        b"truncated": good[: len(good) // 2],
    }
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for key, value in bad.items():
        producer.produce(topics.state, value, key, partition=0)
    producer.produce(topics.state, good, b"job-1", partition=0)
    assert producer.flush(30) == 0

    consumer = DecodingConsumer(
        kafka_bootstrap, unique_name("g"), [topics.state], topics.deadletter
    )
    try:
        got = _drain(consumer, 1)
    finally:
        consumer.close()
    assert len(got) == 1  # the good record after three bad ones
    assert consumer.stats.dead_lettered == 3
    assert consumer.stats.by_reason == {
        "not-avro": 1,
        "unknown-fingerprint": 1,
        "truncated": 1,
    }

    dlq = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": unique_name("d"),
            "auto.offset.reset": "earliest",
        }
    )
    dlq.subscribe([topics.deadletter])
    letters = []
    deadline = time.monotonic() + 30
    while len(letters) < 3 and time.monotonic() < deadline:
        letters += [m for m in dlq.consume(10, 0.5) if m.error() is None]
    dlq.close()
    assert {m.key(): m.value() for m in letters} == bad
    for m in letters:
        headers = dict(m.headers())
        assert set(headers) >= set(DLQ_HEADERS)
        assert headers["mycroft.dlq.source"].startswith(topics.state.encode() + b"[0]@")
    reasons = {m.key(): dict(m.headers())["mycroft.dlq.reason"] for m in letters}
    assert reasons == {
        b"not-avro": b"not-avro",
        b"unknown": b"unknown-fingerprint",
        b"truncated": b"truncated",
    }
