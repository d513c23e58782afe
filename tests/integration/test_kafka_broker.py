"""The real broker: a produce/consume round trip, and data surviving a restart."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mycroft.infra.kafka_broker import KafkaBroker

pytestmark = pytest.mark.integration


def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=1)])
    futures[topic].result(timeout=30)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for index, value in enumerate(values):
        producer.produce(topic, value=value, key=str(index).encode())
    assert producer.flush(30) == 0


def _consume(bootstrap: str, topic: str, group: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
    finally:
        consumer.close()
    return values


def test_round_trip(kafka_bootstrap: str, unique_name: Callable[..., str]) -> None:
    topic = unique_name("test.roundtrip")
    values = [b"", b"\x00\x01\xff", b"hello", bytes(range(256))]
    _create_topic(kafka_bootstrap, topic)
    _produce(kafka_bootstrap, topic, values)
    assert _consume(kafka_bootstrap, topic, unique_name("g"), len(values)) == values


def test_restart_keeps_port_and_data(
    kafka_broker: KafkaBroker, unique_name: Callable[..., str]
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = unique_name("test.restart")
    _create_topic(bootstrap, topic)
    _produce(bootstrap, topic, [b"before-1", b"before-2"])
    pid = kafka_broker.pid
    assert pid is not None

    kafka_broker.stop()
    assert not kafka_broker.is_running
    assert not Path(f"/proc/{pid}").exists()
    assert kafka_broker.exit_code in (0, 143)  # SIGTERM honoured, no SIGKILL
    kafka_broker.stop()  # idempotent

    assert kafka_broker.start() == bootstrap
    assert kafka_broker.pid not in (None, pid)
    _produce(bootstrap, topic, [b"after"])
    got = _consume(bootstrap, topic, unique_name("g"), 3)
    assert got == [b"before-1", b"before-2", b"after"]
