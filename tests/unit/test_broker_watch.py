"""The stream worker says when its Kafka goes away and when it is back."""

from __future__ import annotations

import logging
import socket

import pytest

from mycroft.broker_watch import BrokerWatch, _any_open


def test_it_logs_the_outage_once_and_the_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = iter([True, False, False, False, True, True])
    watch = BrokerWatch("10.0.0.1:9092", check=lambda _: next(answers))
    with caplog.at_level(logging.INFO, logger="mycroft.broker_watch"):
        for _ in range(6):
            watch.step()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0] == (
        "Kafka at 10.0.0.1:9092 unreachable (no broker accepts connections): "
        "retrying until it answers"
    )
    assert said[1] == "Kafka at 10.0.0.1:9092 reachable again"


def test_any_address_that_accepts_connections_counts() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            dead = closed.getsockname()[1]
        assert _any_open(f"127.0.0.1:{dead},127.0.0.1:{port}")
    assert not _any_open(f"127.0.0.1:{dead}")
