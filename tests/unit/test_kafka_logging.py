"""librdkafka's lines go through Python logging, rate-limited per kind."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Producer

from mycroft.kafka_client import producer_config
from mycroft.kafka_logging import LOGGER_NAME, ClientRateLimit, RateLimit, SelfRetried


def _record(
    fac: str,
    client: str = "rdkafka#producer-1",
    text: str = "Connect to 127.0.0.1:1 failed",
    level: int = logging.ERROR,
) -> logging.LogRecord:
    return logging.LogRecord(
        LOGGER_NAME, level, __file__, 1, "%s [%s] %s", (fac, client, text), None
    )


def test_a_repeated_line_passes_once_per_interval_with_the_count_held_back():
    now = [0.0]
    limit = RateLimit(every_s=30.0, clock=lambda: now[0])
    passed = []
    for t in range(0, 61):  # one FAIL line per second for a minute
        now[0] = float(t)
        rec = _record("FAIL")
        if limit.filter(rec):
            passed.append((t, rec.getMessage()))
    assert [t for t, _ in passed] == [0, 30, 60]
    assert passed[0][1].endswith("failed")
    assert passed[1][1].endswith("(29 similar lines held back)")


def test_other_kinds_and_clients_are_limited_apart():
    limit = RateLimit(every_s=30.0, clock=lambda: 0.0)
    assert limit.filter(_record("FAIL"))
    assert limit.filter(_record("GETPID"))
    assert limit.filter(_record("FAIL", "rdkafka#consumer-2"))
    assert not limit.filter(_record("FAIL"))


def test_a_retry_librdkafka_makes_itself_shows_only_at_debug():
    retry = "Failed to acquire idempotence PID: Coordinator load in progress: retrying"
    logger = logging.getLogger(LOGGER_NAME)
    old = logger.level
    try:
        logger.setLevel(logging.INFO)
        rec = _record("GETPID", text=retry, level=logging.WARNING)
        assert not SelfRetried().filter(rec)
        assert rec.levelname == "DEBUG"
        assert SelfRetried().filter(_record("FAIL", level=logging.WARNING))
        logger.setLevel(logging.DEBUG)
        assert SelfRetried().filter(
            _record("GETPID", text=retry, level=logging.WARNING)
        )
    finally:
        logger.setLevel(old)


def test_a_producer_logs_through_python_logging_not_stderr(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
):
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        p = Producer(producer_config("127.0.0.1:1", {"message.timeout.ms": 2000}))
        p.produce("t", b"x")
        for _ in range(8):
            p.poll(0.5)
    fails = [r for r in caplog.records if r.name == LOGGER_NAME]
    assert fails and "Connect to" in fails[0].getMessage()
    assert len(fails) <= 2  # four seconds of retries: one line (and its count)
    assert "|FAIL|" not in capfd.readouterr().err  # librdkafka's own stderr format


def test_aiokafka_lines_are_limited_by_template_and_others_pass():
    now = [0.0]
    limit = ClientRateLimit(every_s=30.0, clock=lambda: now[0])

    def rec(name: str, msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)

    conn = "Unable connect to node with id %s: %s"
    passed = [limit.filter(rec("aiokafka.conn", conn, 1, "refused")) for _ in range(50)]
    assert passed == [True] + [False] * 49
    assert limit.filter(
        rec("aiokafka.cluster", "Unable to update metadata from %s", [1])
    )
    assert all(limit.filter(rec("mycroft.streams.app", conn, 1, "x")) for _ in range(5))
    now[0] = 30.0
    again = rec("aiokafka.conn", conn, 1, "refused")
    assert limit.filter(again) and "(49 similar lines held back)" in again.getMessage()
