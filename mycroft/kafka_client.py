"""confluent-kafka plumbing: topic creation, a record publisher, a decoding consumer.

The publisher is what every producer (node agent, simulator, replay) uses; the
consumer is what tests, the demo and sinks use to read Mycroft topics. An
undecodable record never stops a consumer: it is counted and its original
bytes go to the dead-letter topic with the reason in headers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from mycroft import dead_letters
from mycroft.errors import BrokerError, DecodeError, KafkaRefused
from mycroft.kafka_diagnosis import refused
from mycroft.kafka_logging import client_logger
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Record, Topology
from mycroft.topics import TopicSet, partition_for

log = logging.getLogger(__name__)

DLQ_HEADERS = (dead_letters.REASON, dead_letters.DETAIL, dead_letters.SOURCE)


def producer_config(
    bootstrap: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """librdkafka settings for every Mycroft producer: idempotent, acks=all, lz4."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 20,
        "message.timeout.ms": 120_000,
        "logger": client_logger(),
    }
    return cfg | (extra or {})


def create_topics(
    bootstrap: str,
    topics: TopicSet,
    *,
    replication: int = 1,
    timeout_s: float = 30.0,
    extra: dict[str, Any] | None = None,
) -> list[str]:
    """Create every Mycroft topic that does not exist yet; return those created.

    Idempotent: existing topics are left as they are.

    Raises:
        BrokerError: the broker refused a topic for another reason.
    """
    new = [
        NewTopic(
            topics.name(key),
            num_partitions=topics.partitions(key),
            replication_factor=replication,
            config=spec.config(),
        )
        for key, spec in topics.specs.items()
    ]
    return create_missing(bootstrap, new, timeout_s=timeout_s, extra=extra)


def create_missing(
    bootstrap: str,
    new: list[NewTopic],
    *,
    timeout_s: float = 30.0,
    extra: dict[str, Any] | None = None,
) -> list[str]:
    """Create the topics of ``new`` that do not exist yet; return those created.

    Raises:
        BrokerError: the broker refused a topic for another reason than existing.
    """
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": client_logger()}
    admin = AdminClient(config | (extra or {}))
    created = []
    for name, future in admin.create_topics(new, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and _visible(
                admin, name, timeout_s
            ):
                continue  # made by an admin; this client may use it, not create it
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerError(f"cannot create topic {name}: {err.str()}") from exc
    return created


def _visible(admin: AdminClient, name: str, timeout_s: float) -> bool:
    """Whether topic ``name`` exists and this client may see it (Describe)."""
    try:
        topic = admin.list_topics(name, timeout=timeout_s).topics.get(name)
    except KafkaException:
        return False
    return topic is not None and topic.error is None


def record_key(record: Record) -> tuple[str, str]:
    """Return ``(job id, message key)`` of a record."""
    job_id: str = record.header.job_id if hasattr(record, "header") else record.job_id
    if isinstance(record, Topology):
        return job_id, f"{job_id}/{record.host}"
    return job_id, job_id


@dataclass
class DeliveryStats:
    """What the broker acknowledged or refused, from delivery callbacks."""

    delivered: int = 0
    failed: int = 0
    last_error: str = ""
    refused: KafkaRefused | None = None  # the first refusal (an ACL, credentials)
    failures: list[tuple[str, bytes]] = field(default_factory=list)


class RecordPublisher:
    """Encode records and produce them keyed and partitioned by job id."""

    def __init__(
        self,
        bootstrap: str,
        topics: TopicSet,
        *,
        codec: Codec | None = None,
        extra: dict[str, Any] | None = None,
        on_failure: Callable[[str, bytes, bytes], None] | None = None,
    ) -> None:
        self.topics = topics
        self.codec = codec or Codec()
        self.stats = DeliveryStats()
        self._on_failure = on_failure
        self._producer = Producer(producer_config(bootstrap, extra))

    def publish(self, record: Record) -> None:
        """Queue one record; delivery is confirmed by :meth:`flush` or :meth:`poll`."""
        name = type(record).__name__
        self.publish_bytes(
            self.topics.for_record(name), *record_key(record), self.codec.encode(record)
        )

    def publish_bytes(self, topic: str, job_id: str, key: str, value: bytes) -> None:
        """Queue already-encoded bytes (spool replay, file replay)."""
        partition = partition_for(job_id, self.topics.partitions(self._key_of(topic)))

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self.stats.delivered += 1
                return
            self.stats.failed += 1
            self.stats.last_error = err.str()
            refusal = refused(err)
            if refusal is None or self.stats.refused is None:
                log.warning("delivery to %s failed: %s", topic, err.str())
            self.stats.refused = self.stats.refused or refusal  # the first, once
            if self._on_failure is not None:
                self._on_failure(topic, key.encode(), value)

        while True:
            try:
                self._producer.produce(
                    topic,
                    value,
                    key.encode(),
                    partition=partition,
                    on_delivery=delivered,
                )
                return
            except BufferError:
                self._producer.poll(0.1)

    def _key_of(self, topic: str) -> str:
        for key in self.topics.specs:
            if self.topics.name(key) == topic:
                return key
        raise KeyError(f"{topic} is not a Mycroft topic of this TopicSet")

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery callbacks; return how many ran."""
        return int(self._producer.poll(timeout_s))

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for outstanding deliveries; return how many are still queued."""
        return int(self._producer.flush(timeout_s))


def deadletter_headers(err: DecodeError, source: str) -> dead_letters.Headers:
    """Headers of a dead-letter record: reason, detail (cut to 4 KiB), and
    where it came from; :func:`mycroft.dead_letters.fit` adds the size."""
    return dead_letters.headers_of(err.reason, err.detail, source)


@dataclass
class ConsumerStats:
    """Counts of a :class:`DecodingConsumer`."""

    decoded: int = 0
    dead_lettered: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


def _log_failed_commit(err: KafkaError | None, _partitions: list[Any]) -> None:
    if err is not None and err.code() != KafkaError._NO_OFFSET:
        log.warning(
            "commit failed (%s): the next commit covers these records", err.str()
        )


class DeadLettersPending(KafkaException):
    """Dead letters of polled records were not delivered in time: the commit
    was skipped, so a restart reads those records (and dead-letters them)
    again instead of losing them."""


class DecodingConsumer:
    """Consume Mycroft topics and decode values; bad ones go to the dead letters.

    ``deadletter_topic=None`` makes a read-only consumer (``mycroft incidents``,
    a subscriber credential that may not produce): bad records are logged and
    counted, not re-sent; whoever consumes the topic for real (the worker, the
    sinks) dead-letters them once.
    """

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        topic_names: Iterable[str],
        deadletter_topic: str | None,
        *,
        codec: Codec | None = None,
        extra: dict[str, Any] | None = None,
        auto_commit: bool = True,
    ) -> None:
        self.codec = codec or Codec()
        self.stats = ConsumerStats()
        self._dlq_topic = deadletter_topic
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group_id,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": auto_commit,
                "logger": client_logger(),
                "on_commit": _log_failed_commit,
            }
            | (extra or {})
        )
        self._consumer.subscribe(list(topic_names))
        self._dlq = (
            Producer(producer_config(bootstrap, extra))
            if deadletter_topic is not None
            else None
        )

    def poll(
        self, timeout_s: float = 1.0, max_records: int = 500
    ) -> list[tuple[Message, Record]]:
        """Return the records that arrived within ``timeout_s``, decoded."""
        out: list[tuple[Message, Record]] = []
        for msg in self._consumer.consume(max_records, timeout_s):
            error = msg.error()
            if error is not None:
                if (refusal := refused(error)) is not None:
                    raise refusal  # an ACL refuses the topic or the group
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", error.str())
                continue
            value = msg.value() or b""
            try:
                record = self.codec.decode(value)
            except DecodeError as exc:
                where = (msg.topic() or "?", msg.partition() or 0, msg.offset() or 0)
                self._dead_letter(msg, exc.located(*where))
                continue
            self.stats.decoded += 1
            out.append((msg, record))
        return out

    def caught_up(self, timeout_s: float = 5.0) -> bool:
        """Whether every assigned partition was read up to its end.

        False until the group assigned partitions: a reader of a topic's
        history polls until this is true, then stops.
        """
        assigned = self._consumer.assignment()
        if not assigned:
            return False
        for tp in self._consumer.position(assigned):
            low, high = self._consumer.get_watermark_offsets(
                tp, timeout=timeout_s, cached=False
            )
            if high > max(tp.offset, low):
                return False
        return True

    def _dead_letter(self, msg: Message, err: DecodeError) -> None:
        self.stats.by_reason[err.reason] = self.stats.by_reason.get(err.reason, 0) + 1
        if self._dlq is None or self._dlq_topic is None:
            log.warning("%s; skipped (read-only consumer)", err)
            return
        log.warning("%s; sent to %s", err, self._dlq_topic)
        self.stats.dead_lettered += 1
        source = f"{err.topic}[{err.partition}]@{err.offset}"
        value, headers = dead_letters.fit(
            msg.value(), msg.key(), deadletter_headers(err, source)
        )
        sent: list[tuple[str, str | bytes | None]] = list(headers)
        self._dlq.produce(self._dlq_topic, value, msg.key(), headers=sent)
        self._dlq.poll(0)

    def commit(self, *, asynchronous: bool = False, flush_s: float = 10.0) -> None:
        """Commit the positions of everything polled so far, once the dead
        letters of those records were delivered (waiting at most ``flush_s``).

        Use with ``auto_commit=False`` to commit only after the records were
        handled (at-least-once). ``asynchronous``: do not wait for the broker
        (a synchronous commit waits as long as the group's coordinator is
        away); a failure is logged, and the next commit covers these records.

        Raises:
            DeadLettersPending: dead letters still undelivered after
                ``flush_s`` (Kafka away): nothing was committed; they stay
                queued and the next commit tries again.
        """
        if self._dlq is not None:
            pending = self._dlq.flush(flush_s)
            if pending:
                raise DeadLettersPending(
                    KafkaError(
                        KafkaError._MSG_TIMED_OUT,
                        f"{pending} dead letter(s) not delivered within {flush_s:g} s",
                    )
                )
        if asynchronous:
            self._consumer.commit(asynchronous=True)
        else:
            self._consumer.commit(asynchronous=False)

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush dead letters and leave the group, waiting at most about
        ``timeout_s`` for each: librdkafka's close waits for the group's
        coordinator, for ever while Kafka is away. Not waiting costs the
        graceful leave (the partitions move after the session timeout) and
        an asynchronous commit still in flight (re-read after a restart)."""
        if self._dlq is not None:
            self._dlq.flush(timeout_s)
        closing = threading.Thread(
            target=self._consumer.close, name="consumer-close", daemon=True
        )
        closing.start()
        closing.join(timeout_s)
        if closing.is_alive():
            log.warning(
                "leaving the consumer group took more than %g s (is Kafka "
                "away?): not waiting", timeout_s,
            )  # fmt: skip
