"""Stream-worker lag as Prometheus metrics, read from Kafka's committed offsets.

The Faust workers export no metrics of their own; their consumer group's
committed offsets say how far they got. Every ``interval_s`` a
:class:`LagMonitor` sets, on the registry handed in:

* ``mycroft_consumer_lag_records{group, topic}``: records of ``topic`` past
  the group's last commit, summed over partitions (a partition the group
  never committed counts from its first retained record);
* ``mycroft_topic_end_offset{topic}``: the sum of the partitions' end
  offsets, so ``rate()`` of it is the topic's records per second and the
  alert ``MycroftWorkerLagging`` turns the lag into seconds.

The lag is as coarse as the workers' commit interval (Faust's default
2.8 s). Reading offsets never joins the group: the workers are not disturbed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry, Gauge

from mycroft.kafka_logging import client_logger

logger = logging.getLogger(__name__)

METRIC_NAMES = ("mycroft_consumer_lag_records", "mycroft_topic_end_offset")
"""The metric families a :class:`LagMonitor` defines."""


def partition_lag(committed: int, low: int, high: int) -> int:
    """Records after ``committed`` (``< 0``: nothing committed: from ``low``)."""
    start = committed if committed >= 0 else low
    return max(0, high - max(start, low))


class LagMonitor:
    """Poll the committed offsets of ``groups`` on ``topics`` into gauges.

    Args:
        bootstrap: Kafka bootstrap servers.
        groups: consumer groups to watch (the workers' ``--app-id``).
        topics: topics those groups read.
        registry: where the two gauges are registered.
        interval_s: seconds between two readings.
        extra: more librdkafka settings (security).
    """

    def __init__(
        self,
        bootstrap: str,
        groups: Sequence[str],
        topics: Sequence[str],
        registry: CollectorRegistry,
        *,
        interval_s: float = 5.0,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.groups, self.topics = tuple(groups), tuple(topics)
        self.interval_s = interval_s
        base = {"bootstrap.servers": bootstrap, "enable.auto.commit": False}
        self._config = base | (extra or {})
        self.lag = Gauge(
            "mycroft_consumer_lag_records",
            "Records past the consumer group's last commit.",
            ["group", "topic"], registry=registry,
        )  # fmt: skip
        self.end = Gauge(
            "mycroft_topic_end_offset",
            "Sum of the topic's partition end offsets (rate() = records/s).",
            ["topic"], registry=registry,
        )  # fmt: skip
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_once(self, timeout_s: float = 10.0) -> None:
        """Read every group's offsets once and set the gauges."""
        for group in self.groups:
            consumer = Consumer(
                self._config | {"group.id": group, "logger": client_logger()}
            )
            try:
                self._read_group(consumer, group, timeout_s)
            finally:
                consumer.close()

    def _read_group(self, consumer: Consumer, group: str, timeout_s: float) -> None:
        meta = consumer.list_topics(timeout=timeout_s).topics
        for topic in self.topics:
            if topic not in meta or meta[topic].error is not None:
                continue
            parts = [TopicPartition(topic, p) for p in meta[topic].partitions]
            committed = consumer.committed(parts, timeout=timeout_s)
            marks = [
                consumer.get_watermark_offsets(tp, timeout=timeout_s) for tp in parts
            ]
            self.end.labels(topic).set(sum(high for _, high in marks))
            self.lag.labels(group, topic).set(_sum_lag(committed, marks))

    def start(self) -> None:
        """Read now and then every ``interval_s`` on a daemon thread."""
        self._thread = threading.Thread(
            target=self._run, name="lag-monitor", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.read_once()
            except KafkaException as exc:
                logger.warning(
                    "reading consumer offsets failed (%s); retrying in %.0f s",
                    exc, self.interval_s,
                )  # fmt: skip
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> None:
        """Stop the thread; a reading in flight is abandoned after 0.5 s (the
        thread is a daemon: it never holds the process up, and Ctrl-C stops
        the sinks within 2 s also while Kafka is away)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(0.5)


def _sum_lag(committed: Iterable[TopicPartition], marks: list[tuple[int, int]]) -> int:
    return sum(
        partition_lag(tp.offset, low, high)
        for tp, (low, high) in zip(committed, marks, strict=True)
    )
