"""What the stream worker does with records that break the input contract.

The job's :class:`~mycroft.streams.core.record_gate.RecordGate` (inside its
engine) rejects them; the worker drains the rejections after each
evaluation, sends the rejected rows to the dead-letter topic (re-encoded as
a record of the same type and header, reason in the headers), and counts
them in ``mycroft_invalid_records_total{reason,host}``, served with the
worker's other metrics (its record lag, event-time hold, jobs and intake,
the same numbers its ``stats`` log line gives) on ``--metrics-port``
(alert ``MycroftInvalidRecords`` in ``infra/prometheus/``).
``mycroft_flagged_hosts{job,host}`` is 1 for a host that kept sending invalid
data (``Contract.flag_after``).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from mycroft.errors import DecodeError, EncodeError
from mycroft.schemas.codec import Codec
from mycroft.streams.core.contract import Rejection
from mycroft.streams.core.record_gate import RecordGate

log = logging.getLogger(__name__)


def gate_of(engine: Any) -> RecordGate | None:
    """The record gate of an engine (an ``Analyzer``, or one it wraps)."""
    for candidate in (engine, getattr(engine, "inner", None)):
        gate = getattr(candidate, "gate", None)
        if isinstance(gate, RecordGate):
            return gate
    return None


class WorkerMetrics:
    """The worker's own Prometheus metrics, on a registry handed in."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.invalid = Counter(
            "mycroft_invalid_records_total",
            "Records (or rows of one) rejected by the input contract and "
            "dead-lettered, by reason and reporting host",
            ["reason", "host"],
            registry=self.registry,
        )
        self.flagged = Gauge(
            "mycroft_flagged_hosts",
            "1 for a host that keeps sending invalid records",
            ["job", "host"],
            registry=self.registry,
        )
        self.tombstones = Counter(
            "mycroft_tombstones_total",
            "Null values read: on the topology topic a host left; elsewhere "
            "dead-lettered as null-value",
            ["topic"],
            registry=self.registry,
        )

        self.lag = Gauge(
            "mycroft_worker_record_lag_seconds",
            "Worst age of a record when the worker read it (now minus its "
            "broker time) over the last stats interval",
            registry=self.registry,
        )
        self.hold = Gauge(
            "mycroft_worker_event_hold_seconds",
            "Longest span of a job's event time read but not yet evaluated "
            "(the watermark waiting on a slower source, or a backlog)",
            registry=self.registry,
        )
        self.jobs = Gauge(
            "mycroft_worker_jobs", "Jobs the worker holds", registry=self.registry
        )
        self.event_s = Histogram(
            "mycroft_worker_event_seconds",
            "Time the worker spent on one source event (a record, or a tick "
            "evaluating its partition's jobs), awaits included: an upper bound "
            "on how long it held the event loop",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.rows = Counter(
            "mycroft_worker_rank_state_rows_total",
            "Rank-state rows decoded (rate(): the worker's intake)",
            registry=self.registry,
        )

    def observe(self, lag_s: float, hold_s: float, jobs: int, rows: int) -> None:
        """The worker's stats of one interval, as logged."""
        self.lag.set(lag_s)
        self.hold.set(hold_s)
        self.jobs.set(jobs)
        self.rows.inc(rows)

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``address:port`` (port 0: not served)."""
        if port:
            start_http_server(port, address, registry=self.registry)
            log.info("worker metrics on http://%s:%d/metrics", address, port)


def host_label(r: Rejection, gate: RecordGate) -> str:
    """The host label of a rejection: a host the job declared or was
    accepted from, else ``undeclared`` (hostile names must not grow the
    metric's series without bound)."""
    known = r.host in gate.hosts or r.host in gate.topo.hosts
    return r.host if known else "undeclared"


def dead_letter_value(r: Rejection, codec: Codec) -> bytes:
    """The wire bytes of the rejected rows (empty when they do not encode)."""
    if r.part is None:
        return b""
    try:
        return codec.encode(r.part)
    except EncodeError as exc:
        log.warning("rejected %s rows do not encode (%s)", r.record_type, exc)
        return b""


def as_decode_error(r: Rejection, job: str) -> DecodeError:
    """A rejection in the dead-letter topic's terms (reason, detail)."""
    return DecodeError(r.reason.value, f"{r.record_type} of {job}/{r.host}: {r.detail}")
