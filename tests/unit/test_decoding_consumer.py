"""DecodingConsumer without a broker: dead letters that cannot be delivered
hold the commit back (bounded), and a read-only consumer never produces."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Message

from mycroft.errors import DecodeError
from mycroft.kafka_client import DeadLettersPending, DecodingConsumer

NOWHERE = "127.0.0.1:9"  # discard port: nothing answers Kafka there


def _garbage(offset: int) -> Message:
    return Message(topic="t", partition=0, offset=offset, value=b"\x00not avro")


def test_undelivered_dead_letters_skip_the_commit_within_its_bound() -> None:
    consumer = DecodingConsumer(NOWHERE, "g", ["t"], "dlq", auto_commit=False)
    try:
        consumer._dead_letter(_garbage(7), _decode_error(consumer, 7))
        t0 = time.monotonic()
        with pytest.raises(DeadLettersPending, match="1 dead letter"):
            consumer.commit(asynchronous=True, flush_s=0.3)
        assert time.monotonic() - t0 < 2.0
        assert consumer.stats.dead_lettered == 1
    finally:
        consumer.close(timeout_s=0.2)


def test_a_read_only_consumer_counts_bad_records_and_sends_nothing() -> None:
    consumer = DecodingConsumer(NOWHERE, "g", ["t"], None, auto_commit=False)
    try:
        consumer._dead_letter(_garbage(3), _decode_error(consumer, 3))
        assert consumer.stats.dead_lettered == 0
        assert sum(consumer.stats.by_reason.values()) == 1
    finally:
        consumer.close(timeout_s=0.2)


def _decode_error(consumer: DecodingConsumer, offset: int) -> DecodeError:
    """The error the codec raises for the garbage record, located."""
    with pytest.raises(DecodeError) as caught:
        consumer.codec.decode(b"\x00not avro")
    return caught.value.located("t", 0, offset)
