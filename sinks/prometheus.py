"""Detection results as Prometheus metrics, for Grafana dashboards and alerts.

Every metric lives in the :class:`~prometheus_client.CollectorRegistry` handed
in, never in the global one. Label values are bounded: ``job_id`` and ``kind``
per counter, and per-incident series exist only while the incident is open.
The training job's label is ``job_id``, never ``job``: Prometheus sets ``job``
to the scrape job and would rename ours to ``exported_job``.

An incident opens with its first root cause and closes when no revision came
for ``incident_ttl_s`` seconds (the records carry no "closed" flag), or when
:meth:`PrometheusSink.close_incident` is called. Closing removes its
``mycroft_root_cause_info`` and ``mycroft_culprit_confidence`` series.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mycroft.errors import SinkError
from mycroft.schemas.records import Anomaly, RootCause
from mycroft.sinks.base import SinkRecord

LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
"""Histogram buckets of both latencies, in seconds."""

INFO_LABELS = ("job_id", "incident", "rank", "host", "component", "kind")
"""Labels of ``mycroft_root_cause_info``: the best culprit of one open incident."""

METRIC_NAMES = (
    "mycroft_anomalies_total",
    "mycroft_incidents_total",
    "mycroft_root_cause_revisions_total",
    "mycroft_incidents_open",
    "mycroft_root_cause_info",
    "mycroft_culprit_confidence",
    "mycroft_detection_latency_seconds",
    "mycroft_rca_latency_seconds",
)
"""Every metric family this sink defines (the dashboard test checks against it)."""

_SEEN_ANOMALIES = 65_536  # dedup window of re-delivered anomaly ids


@dataclass(frozen=True)
class _Open:
    """What the sink remembers of one open incident."""

    job: str
    kind: str
    revision: int
    info: tuple[str, ...]  # label values of the info series, INFO_LABELS order
    updated_s: float


class PrometheusSink:
    """Turn anomalies and root causes into metrics on ``registry``.

    Args:
        registry: where the metrics are registered; one per sink (and per test).
        incident_ttl_s: an incident without a new revision for this many
            seconds is closed and its per-incident series removed.
        clock: monotonic seconds; injected by tests.

    Raises:
        ValueError: from prometheus_client, if ``registry`` already holds
            metrics of the same names.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        incident_ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self._ttl_s = incident_ttl_s
        self._clock = clock
        self._open: dict[str, _Open] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._closed = False
        self.anomalies = Counter(
            "mycroft_anomalies", "Anomalies detected (deduplicated by id).",
            ["job_id", "kind"], registry=registry,
        )  # fmt: skip
        self.incidents = Counter(
            "mycroft_incidents", "Incidents seen (first root cause of each).",
            ["job_id", "kind"], registry=registry,
        )  # fmt: skip
        self.revisions = Counter(
            "mycroft_root_cause_revisions", "Root-cause revisions applied.",
            ["job_id"], registry=registry,
        )  # fmt: skip
        self.open = Gauge(
            "mycroft_incidents_open", "Incidents open now.",
            ["job_id", "kind"], registry=registry,
        )  # fmt: skip
        self.info = Gauge(
            "mycroft_root_cause_info",
            "Best culprit of each open incident (value 1; superseded series removed).",
            list(INFO_LABELS), registry=registry,
        )  # fmt: skip
        self.confidence = Gauge(
            "mycroft_culprit_confidence",
            "Confidence of the best culprit of each open incident (0..1).",
            ["job_id", "incident"], registry=registry,
        )  # fmt: skip
        self.detection_latency = Histogram(
            "mycroft_detection_latency_seconds",
            "Fault onset to detection, per anomaly (trace clock).",
            ["kind"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.rca_latency = Histogram(
            "mycroft_rca_latency_seconds",
            "Detection to first root cause, per incident (trace clock).",
            ["kind"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )  # fmt: skip

    def write(self, record: SinkRecord) -> None:
        """Update the metrics from one record; re-delivery changes nothing.

        Raises:
            SinkError: not retryable, after :meth:`close`.
        """
        if self._closed:
            raise SinkError("PrometheusSink is closed", retryable=False)
        if isinstance(record, Anomaly):
            self._anomaly(record)
        elif isinstance(record, RootCause):
            self._root_cause(record)
        self.expire()

    def _anomaly(self, a: Anomaly) -> None:
        if a.anomaly_id in self._seen:
            return
        self._seen[a.anomaly_id] = None
        if len(self._seen) > _SEEN_ANOMALIES:
            self._seen.popitem(last=False)
        self.anomalies.labels(a.job_id, a.kind.value).inc()
        latency_s = max(0.0, (a.detected_ns - a.onset_ns) / 1e9)
        self.detection_latency.labels(a.kind.value).observe(latency_s)

    def _root_cause(self, rc: RootCause) -> None:
        old = self._open.get(rc.incident_id)
        if old is not None and rc.revision <= old.revision:
            return  # a duplicate or an older revision delivered again
        if old is None:
            self.incidents.labels(rc.job_id, rc.kind.value).inc()
            latency_s = max(0.0, rc.rca_latency_s)
            self.rca_latency.labels(rc.kind.value).observe(latency_s)
        else:
            self._forget(rc.incident_id, old)
        self.revisions.labels(rc.job_id).inc()
        info = _info_labels(rc)
        entry = _Open(rc.job_id, rc.kind.value, rc.revision, info, self._clock())
        self._open[rc.incident_id] = entry
        self.open.labels(entry.job, entry.kind).inc()
        if info:
            self.info.labels(*info).set(1)
            best = rc.culprits[0].confidence
            self.confidence.labels(rc.job_id, rc.incident_id).set(best)

    def _forget(self, incident_id: str, entry: _Open) -> None:
        self.open.labels(entry.job, entry.kind).dec()
        if entry.info:
            self.info.remove(*entry.info)
            self.confidence.remove(entry.job, incident_id)

    def close_incident(self, incident_id: str) -> bool:
        """Close one incident now; return whether it was open."""
        entry = self._open.pop(incident_id, None)
        if entry is None:
            return False
        self._forget(incident_id, entry)
        return True

    def expire(self) -> list[str]:
        """Close incidents idle for longer than ``incident_ttl_s``; return their ids."""
        cutoff = self._clock() - self._ttl_s
        stale = [i for i, e in self._open.items() if e.updated_s < cutoff]
        for incident_id in stale:
            self.close_incident(incident_id)
        return stale

    @property
    def open_incidents(self) -> frozenset[str]:
        """Ids of the incidents open now."""
        return frozenset(self._open)

    def flush(self) -> None:
        """Expire idle incidents; metrics are visible as soon as they are set."""
        self.expire()

    def close(self) -> None:
        """Refuse later writes; the registry keeps its last values."""
        self._closed = True


def _info_labels(rc: RootCause) -> tuple[str, ...]:
    """Label values of the info series of ``rc``; empty without culprits."""
    if not rc.culprits:
        return ()
    best = rc.culprits[0]
    return (
        rc.job_id,
        rc.incident_id,
        str(best.rank),
        best.host,
        best.component.value,
        best.kind.value,
    )
