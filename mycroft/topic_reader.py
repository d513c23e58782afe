"""Read Mycroft topics from their beginning without joining a consumer group.

``mycroft incidents`` and the report read a few topics whole, once. A
subscribed consumer spends seconds before its first record: the group's
join, the broker's initial rebalance delay (3 s by default), then one
watermark request per partition per poll to tell whether it is done. A
:class:`TopicReader` asks for the topics' metadata and end offsets once,
assigns every partition that holds records at its beginning, and is done
when each has been read up to the end it saw at the start; what arrives
later is read too, for a reader that follows.

A topic the client may not read is skipped (a subscriber credential reads
the root causes, not the anomalies); when it may read none of them, that is
the error. Read-only: an undecodable record is logged and skipped (whoever consumes the
topic for real dead-letters it once), and no offset is committed, so the
group id given to the client is never joined nor needs an ACL.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from mycroft.errors import DecodeError
from mycroft.kafka_diagnosis import ErrorWatch, raise_if_refused
from mycroft.kafka_logging import client_logger
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Record

log = logging.getLogger(__name__)


class TopicReader:
    """Every partition of ``topic_names`` from its beginning, decoded.

    Args:
        bootstrap: Kafka bootstrap servers.
        topic_names: the topics to read; those the broker lacks are skipped.
        extra: more librdkafka settings (TLS, SASL).
        timeout_s: how long the metadata and end-offset requests may take.
        group_prefix: the client's group id is ``PREFIX-<random>`` (never
            joined; librdkafka wants one).
    """

    def __init__(
        self,
        bootstrap: str,
        topic_names: Iterable[str],
        *,
        extra: dict[str, Any] | None = None,
        timeout_s: float = 10.0,
        group_prefix: str = "mycroft-reader",
    ) -> None:
        self.codec = Codec()
        self.skipped = 0
        self._watch = ErrorWatch()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{group_prefix}-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "logger": client_logger(),
                "error_cb": self._watch,
            }
            | (extra or {})
        )
        self._ends: dict[tuple[str, int], int] = {}
        self.topics: list[str] = []
        self.missing: list[str] = []  # asked for, not on the broker (yet)
        try:
            self._assign(list(topic_names), timeout_s)
        except KafkaException as exc:
            self._consumer.close()
            raise_if_refused(self._watch, exc)
            raise

    def _assign(self, names: list[str], timeout_s: float) -> None:
        parts: list[TopicPartition] = []
        refused: KafkaError | None = None
        for name in names:
            # One topic per request: a full listing leaves out the topics
            # this client may not describe, instead of saying it may not.
            topic = self._consumer.list_topics(name, timeout=timeout_s).topics[name]
            if topic.error is not None:
                if topic.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    refused = topic.error  # a subscriber may read fewer topics
                    log.debug("not allowed to read %s: skipped", name)
                    continue
                if topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    self.missing.append(name)
                    continue
                raise KafkaException(topic.error)
            parts += self._partitions(name, topic.partitions, timeout_s)
        if refused is not None and not parts:
            raise KafkaException(refused)  # none of them: that is the answer
        self.topics = sorted({tp.topic for tp in parts})
        self._consumer.assign(parts)

    def take_new_topics(self, timeout_s: float = 1.0) -> list[str]:
        """Start reading those of the missing topics that exist now, from
        their beginning (a follower started before the topics were
        created); return their names."""
        found = []
        for name in list(self.missing):
            topic = self._consumer.list_topics(name, timeout=timeout_s).topics[name]
            if topic.error is not None or not topic.partitions:
                continue
            self._consumer.incremental_assign(
                [TopicPartition(name, p, OFFSET_BEGINNING) for p in topic.partitions]
            )
            self.missing.remove(name)
            found.append(name)
        self.topics = sorted({*self.topics, *found})
        return found

    def _partitions(
        self, name: str, partitions: Iterable[int], timeout_s: float
    ) -> list[TopicPartition]:
        """The partitions of ``name`` from their beginning; their ends noted."""
        out = []
        for p in sorted(partitions):
            tp = TopicPartition(name, p)
            low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout_s)
            if high > low:
                self._ends[(name, p)] = high
            out.append(TopicPartition(name, p, OFFSET_BEGINNING))
        return out

    def caught_up(self) -> bool:
        """Whether every partition was read up to the end it had at the start."""
        if not self._ends:
            return True
        done = self._consumer.position([TopicPartition(t, p) for t, p in self._ends])
        return all(tp.offset >= self._ends[(tp.topic, tp.partition)] for tp in done)

    def poll(
        self, timeout_s: float = 1.0, max_records: int = 500
    ) -> list[tuple[Message, Record]]:
        """The records that arrived within ``timeout_s``, decoded.

        Raises:
            KafkaException: the broker refuses to let this client read (an
                authorization failure), with the refusal's error.
        """
        out: list[tuple[Message, Record]] = []
        for msg in self._consumer.consume(max_records, timeout_s):
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise_if_refused(self._watch, KafkaException(error))
                    log.warning("consumer error: %s", error.str())
                continue
            try:
                out.append((msg, self.codec.decode(msg.value() or b"")))
            except DecodeError as exc:
                where = (msg.topic() or "?", msg.partition() or 0, msg.offset() or 0)
                self.skipped += 1
                log.warning("%s; skipped (read-only reader)", exc.located(*where))
        return out

    def close(self) -> None:
        """Close the client (nothing to commit, no group to leave)."""
        self._consumer.close()
