"""Fixtures shared by every test tier: a real Kafka broker and unique names.

Where the broker comes from, in order:

1. ``MYCROFT_TEST_BROKER=host:port`` — an existing broker, checked for metadata;
2. a Docker engine plus ``testcontainers`` (optional convenience, never required);
3. :class:`mycroft.infra.kafka_broker.KafkaBroker` — Kafka jars from Maven Central.

When none works the dependent tests skip locally and **fail** when ``CI`` is set.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mycroft.errors import MycroftError
from mycroft.infra.kafka_broker import KafkaBroker, check_bootstrap
from tests.services import unavailable


def _docker_kafka(stack: contextlib.ExitStack) -> str | None:
    """Start Kafka with testcontainers when Docker answers; None otherwise."""
    try:
        docker: Any = importlib.import_module("docker")
        kafka: Any = importlib.import_module("testcontainers.kafka")
        docker.from_env(timeout=3).ping()
    except Exception:  # not installed, no engine: use the local launcher
        return None
    try:
        container: Any = stack.enter_context(kafka.KafkaContainer().with_kraft())
        return str(container.get_bootstrap_server())
    except Exception:  # image pull or start failed: use the local launcher
        return None


def _start(broker: KafkaBroker) -> str | None:
    """Start ``broker``; return why it failed, or None when it runs."""
    try:
        broker.start()
    except MycroftError as exc:
        broker.close()
        return str(exc)
    return None


def _local_kafka(stack: contextlib.ExitStack) -> str:
    broker = KafkaBroker()
    stack.callback(broker.close)
    if (error := _start(broker)) is not None:
        unavailable("Kafka broker", error)
    return broker.bootstrap


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of one broker shared by the whole session."""
    external = os.environ.get("MYCROFT_TEST_BROKER", "").strip()
    if external:
        error = None
        try:
            check_bootstrap(external, timeout_s=10.0)
        except MycroftError as exc:
            error = f"MYCROFT_TEST_BROKER={external!r}: {exc}"
        if error is not None:
            unavailable("Kafka broker", error)
        yield external
        return
    with contextlib.ExitStack() as stack:
        yield _docker_kafka(stack) or _local_kafka(stack)


@pytest.fixture
def kafka_broker() -> Iterator[KafkaBroker]:
    """A fresh broker of this test's own, free to stop and restart."""
    broker = KafkaBroker()
    if (error := _start(broker)) is not None:
        unavailable("Kafka broker", error)
    yield broker
    broker.close()


@pytest.fixture
def unique_name() -> Callable[..., str]:
    """Return ``make(prefix="test") -> "<prefix>.<12 hex>"`` for topics and groups."""

    def make(prefix: str = "test") -> str:
        safe = re.sub(r"[^A-Za-z0-9._-]", "-", prefix)[:200]
        return f"{safe}.{uuid.uuid4().hex[:12]}"

    return make
