"""Ship spooled records to Kafka in order, surviving outages.

State machine: *healthy* — every record is produced as soon as it is spooled;
one failed delivery, or librdkafka reporting every broker down (seconds into
an outage, where a delivery fails only after ``message.timeout.ms``), makes
it *unhealthy* — nothing new is produced, and the log says so; once
librdkafka has no message in flight the oldest unacknowledged record is sent
alone as a probe every ``retry_s``; when the probe is acknowledged the shipper
is healthy again and replays every still-unacknowledged record in spool order.
A record that was delivered but whose acknowledgement was lost is sent again
with its original bytes, so its ``(job, host, agent_epoch, agent_seq)`` dedup
key is unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, Producer

from mycroft.kafka_client import producer_config
from mycroft.producers.agent.spool import Entry, Spool
from mycroft.topics import TopicSet, partition_for

log = logging.getLogger(__name__)

STATUS_EVERY_S = 30.0
"""While Kafka is away, how often the log says how much waits in the spool."""

DoneCallback = Callable[[str | None, bool], None]
"""``(error text or None, permanent)``"""


class Transport(Protocol):
    """Where records go (Kafka; a fake in unit tests)."""

    def produce(self, entry: Entry, on_done: DoneCallback) -> None:
        """Queue one record; ``on_done`` runs from :meth:`poll` or :meth:`flush`."""

    def poll(self, timeout_s: float) -> None:
        """Serve delivery callbacks."""

    def flush(self, timeout_s: float) -> int:
        """Wait for deliveries; return how many are still in flight."""

    def inflight(self) -> int:
        """Records queued or in flight."""

    def broker_down(self) -> str | None:
        """Why every broker became unreachable since the last call, else None."""


_PERMANENT = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    getattr(KafkaError, "_MSG_SIZE_TOO_LARGE", KafkaError.MSG_SIZE_TOO_LARGE),
}


class KafkaTransport:
    """confluent-kafka: idempotent, acks=all, lz4 (``producer_config``), by job.

    Args:
        bootstrap: broker list.
        topics: the topic set (gives partition counts).
        extra: librdkafka settings layered on ``producer_config`` (security, timeouts).
    """

    def __init__(self, bootstrap: str, topics: TopicSet, extra: dict[str, Any]) -> None:
        self._partitions = {topics.name(k): topics.partitions(k) for k in topics.specs}
        self._bootstrap = bootstrap
        self._down: str | None = None
        config = producer_config(bootstrap, extra) | {"error_cb": self._on_error}
        self._producer = Producer(config)

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._down = f"Kafka at {self._bootstrap} unreachable (no broker answers)"

    def produce(self, entry: Entry, on_done: DoneCallback) -> None:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                on_done(None, False)
            else:
                on_done(err.str(), err.code() in _PERMANENT)

        partition = partition_for(entry.job_id, self._partitions[entry.topic])
        while True:
            try:
                self._producer.produce(
                    entry.topic,
                    entry.value,
                    entry.key.encode(),
                    partition=partition,
                    on_delivery=delivered,
                )
                return
            except BufferError:  # local queue full: serve callbacks, then retry
                self._producer.poll(0.05)

    def poll(self, timeout_s: float) -> None:
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        return int(self._producer.flush(timeout_s))

    def inflight(self) -> int:
        return len(self._producer)

    def broker_down(self) -> str | None:
        down, self._down = self._down, None
        return down


class Shipper:
    """Spool first, then produce; acknowledge into the spool from delivery callbacks.

    Counters (cumulative): ``sent`` acknowledged records, ``spooled`` records that
    waited in the spool because Kafka was unhealthy or behind, ``failures`` failed
    delivery attempts, ``rejected`` records the broker refused for good (dropped).
    """

    def __init__(
        self,
        spool: Spool,
        transport: Transport,
        *,
        retry_s: float = 1.0,
        max_inflight: int = 5000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spool, self.transport = spool, transport
        self.retry_s, self.max_inflight, self._clock = retry_s, max_inflight, clock
        self.healthy = True
        self.sent = self.spooled = self.failures = self.rejected = 0
        first = spool.first_pending()
        self._next_send = spool.next_eid if first is None else first
        self._probe_at = 0.0
        self._probing = False
        self._outstanding = 0
        self._status_at = 0.0

    def submit(
        self, entries: Sequence[Entry], checkpoint: dict[str, Any] | None
    ) -> None:
        """Spool ``entries`` with the source checkpoint; produce them if healthy."""
        first = self.spool.append(entries, checkpoint)
        caught_up = self.healthy and self._next_send == first
        if caught_up and self._outstanding + len(entries) <= self.max_inflight:
            for i, entry in enumerate(entries):
                self._produce(first + i, entry)
            self._next_send = first + len(entries)
        else:
            self.spooled += len(entries)
        self.pump()

    def pump(self) -> None:
        """Serve callbacks; replay the backlog when healthy, probe when not."""
        self.transport.poll(0)
        down = self.transport.broker_down()
        if down and self.healthy:
            self._unhealthy(f"{down}: spooling to {self.spool.dir}")
        elif not self.healthy and self._clock() >= self._status_at:
            self._status_at = self._clock() + STATUS_EVERY_S
            log.warning(
                "Kafka still unreachable: records in the spool: %d (%d bytes); "
                "retrying every %g s",
                self.spool.pending, self.spool.size_bytes, self.retry_s,
            )  # fmt: skip
        if self.healthy:
            room = self.max_inflight - self._outstanding
            for eid in self.spool.pending_from(self._next_send, room):
                entry = self.spool.read(eid)
                if entry is not None:
                    self._produce(eid, entry)
                self._next_send = eid + 1
            if self._outstanding < self.max_inflight:
                self._next_send = max(self._next_send, self.spool.next_eid)
        elif self._outstanding == 0 and self._clock() >= self._probe_at:
            first = self.spool.first_pending()
            if first is None:
                return  # nothing to probe with: the next record will be the probe
            entry = self.spool.read(first)
            if entry is None:
                self._recovered(self.spool.next_eid)
                return
            self._probing = True
            self._produce(first, entry)

    def _produce(self, eid: int, entry: Entry) -> None:
        self._outstanding += 1
        self.transport.produce(
            entry, lambda err, permanent: self._done(eid, err, permanent)
        )

    def _done(self, eid: int, err: str | None, permanent: bool) -> None:
        self._outstanding -= 1
        probe, self._probing = self._probing and self._outstanding == 0, False
        if err is None:
            self.spool.ack(eid)
            self.sent += 1
            if probe and not self.healthy:
                self._recovered(eid + 1)
            return
        self.failures += 1
        if permanent:
            log.error(
                "record %d rejected by the broker for good (%s): dropped", eid, err
            )
            self.spool.ack(eid)
            self.rejected += 1
            return
        if self.healthy:
            self._unhealthy(f"delivery failed ({err}): spooling")
        self._probe_at = self._clock() + self.retry_s

    def _unhealthy(self, why: str) -> None:
        log.warning(
            "%s; retrying every %g s until Kafka answers (records pending: %d)",
            why, self.retry_s, self.spool.pending,
        )  # fmt: skip
        self.healthy = False
        self._probe_at = self._clock() + self.retry_s
        self._status_at = self._clock() + STATUS_EVERY_S

    def _recovered(self, next_send: int) -> None:
        log.info(
            "Kafka reachable again: replaying %d spooled records", self.spool.pending
        )
        self.healthy = True
        first = self.spool.first_pending()
        self._next_send = next_send if first is None else first

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding deliveries (SIGTERM); return what is still pending."""
        deadline = self._clock() + timeout_s
        while self._clock() < deadline:
            self.pump()
            self.transport.flush(min(0.2, max(0.0, deadline - self._clock())))
            if self._outstanding == 0 and (self.spool.pending == 0 or not self.healthy):
                break
        return self.spool.pending
