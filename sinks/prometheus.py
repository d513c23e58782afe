"""Detection results as Prometheus metrics, for Grafana dashboards and alerts.

Every metric lives in the :class:`~prometheus_client.CollectorRegistry` handed
in, never in the global one. The training job's label is ``job_id``, never
``job``: Prometheus sets ``job`` to the scrape job and would rename ours to
``exported_job``.

Latencies are per incident, observed once, from its revision 0 (the first
root cause; a sink that first sees a later revision does not guess):

* ``mycroft_detection_latency_seconds``: fault onset to the incident's
  detection, ``detected_ns - onset_ns``.
* ``mycroft_rca_latency_seconds``: fault onset to the first root cause,
  ``resolved_ns - onset_ns``: how long after the fault the culprit was named.
  Detection to root cause on the trace clock is zero whenever the evidence at
  detection already names the culprit (most hangs), so it would say nothing;
  ``bench/campaign/score.py`` defines ``rca_latency_s`` the same way.

Both are on the trace clock (the hosts' clocks), so a replayed trace gives
the latencies of its live run. Anomalies only count
(``mycroft_anomalies_total``): one incident raises one per affected
communicator.

Cardinality: counters carry ``job_id`` and ``kind``; per-incident series
(``mycroft_root_cause_info``, ``mycroft_root_cause_reason_info``,
``mycroft_culprit_confidence``) exist only while the incident is open, one
each, replaced by each revision. ``mycroft_root_cause_info`` names the best
culprit: rank, host, component, kind, for a link fault ``flow``
(``"33->41 ch2"``: rank, peer, channel; empty otherwise), and what is blamed:
``scope`` and ``culprit`` in words (a NIC fault names the NIC and its ranks).
The culprit's reason is free text, so it sits alone on
``mycroft_root_cause_reason_info`` (cut to :data:`REASON_MAX_CHARS`): its
wording may change between revisions without changing the identity of the
culprit series, and the number of series stays one per open incident
whatever the text.

Ends: an incident closes

* on its **closed revision** (RootCause.4 on: the worker sends the latest
  answer again with ``state`` closed once nothing fired for
  ``incident_quiet_s`` of event time). Its per-incident series are removed,
  not zeroed, and ``mycroft_incidents_open`` goes down, so
  ``MycroftIncidentOpen`` resolves at the next rule evaluation. A later,
  re-delivered open revision of it does not reopen it;
* when its **job ends**: no record of the job (heartbeat, anomaly, root
  cause) for ``job_end_s`` seconds. Agents heartbeat every second per host,
  also while the job hangs, so a silent job has stopped or lost its agents.
  Every series of the job is then removed (its history stays in Prometheus);
* when it saw no new revision for ``incident_ttl_s``, only for records of a
  RootCause.1-3 writer (``RootCause.states_closure`` False), which never
  sends a closed revision: a fault that cleared while the job ran on is
  never announced by such a writer. An incident of a newer writer stays
  open however long it lasts without a revision;
* or when :meth:`PrometheusSink.close_incident` is called.

A job's counters start at zero when the job is first seen, so that
``increase()`` counts its first incident and anomalies.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mycroft.errors import SinkError
from mycroft.schemas.records import Anomaly, Culprit, RootCause
from mycroft.schemas.vocab import FaultKind
from mycroft.sinks.base import SinkRecord

LATENCY_BUCKETS_S = (
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
"""Histogram buckets of both latencies, in seconds; 3, 10 and 15 s are the
alert thresholds (infra/prometheus/mycroft-alerts.yml), so quantiles there
are exact."""

INFO_LABELS = (
    "job_id", "incident", "rank", "host", "component", "kind", "flow", "scope",
    "culprit",
)  # fmt: skip
"""Labels of ``mycroft_root_cause_info``: the best culprit of one open incident.
``scope`` is what is blamed (``rank``, ``nic``, ``host``, ``link``) and
``culprit`` the same in words (``NIC mlx5_0 of node0004 (ranks 32, 33)``)."""

REASON_MAX_CHARS = 200
"""Longest reason text on ``mycroft_root_cause_reason_info``."""

METRIC_NAMES = (
    "mycroft_anomalies_total",
    "mycroft_incidents_total",
    "mycroft_root_cause_revisions_total",
    "mycroft_incidents_open",
    "mycroft_root_cause_info",
    "mycroft_root_cause_reason_info",
    "mycroft_culprit_confidence",
    "mycroft_detection_latency_seconds",
    "mycroft_rca_latency_seconds",
    "mycroft_jobs_active",
)
"""Every metric family this sink defines (the dashboard test checks against it)."""

_SEEN_ANOMALIES = 65_536  # dedup window of re-delivered anomaly ids
_ENDED_INCIDENTS = 65_536  # closed incidents remembered against re-delivery
_KINDS = tuple(k.value for k in FaultKind)


@dataclass(frozen=True)
class _Open:
    """What the sink remembers of one open incident."""

    job: str
    kind: str
    revision: int
    info: tuple[str, ...]  # label values of the info series, INFO_LABELS order
    reason: str
    updated_s: float
    ttl: bool  # its writer never sends a closed revision: the TTL closes it


class PrometheusSink:
    """Turn anomalies and root causes into metrics on ``registry``.

    Args:
        registry: where the metrics are registered; one per sink (and per test).
        incident_ttl_s: an incident of a writer that never sends a closed
            revision (RootCause.1-3) is closed after this many seconds
            without a new revision, and its per-incident series removed.
        job_end_s: a job without any record for this many seconds has ended:
            its incidents close and its series are removed.
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
        job_end_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self._ttl_s = incident_ttl_s
        self._job_end_s = job_end_s
        self._clock = clock
        self._open: dict[str, _Open] = {}
        self._jobs: dict[str, float] = {}  # job -> last record, clock seconds
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._ended: OrderedDict[str, int] = OrderedDict()  # id -> closed revision
        self._closed = False
        self._define(registry)

    def _define(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str) -> Histogram:
            h = Histogram(name, doc, ["kind"], buckets=LATENCY_BUCKETS_S,
                          registry=registry)  # fmt: skip
            for kind in _KINDS:
                h.labels(kind)  # series from 0, so rate() sees the first one
            return h

        self.anomalies = counter(
            "mycroft_anomalies", "Anomalies detected (deduplicated by id).",
            "job_id", "kind",
        )  # fmt: skip
        self.incidents = counter(
            "mycroft_incidents", "Incidents seen (first root cause of each).",
            "job_id", "kind",
        )  # fmt: skip
        self.revisions = counter(
            "mycroft_root_cause_revisions", "Root-cause revisions applied.", "job_id"
        )
        self.open = gauge(
            "mycroft_incidents_open", "Incidents open now.", "job_id", "kind"
        )
        self.info = gauge(
            "mycroft_root_cause_info",
            "Best culprit of each open incident (value 1; superseded series removed).",
            *INFO_LABELS,
        )  # fmt: skip
        self.reason = gauge(
            "mycroft_root_cause_reason_info",
            "Why the best culprit of each open incident is blamed (value 1).",
            "job_id", "incident", "reason",
        )  # fmt: skip
        self.confidence = gauge(
            "mycroft_culprit_confidence",
            "Confidence of the best culprit of each open incident (0..1).",
            "job_id", "incident",
        )  # fmt: skip
        self.jobs = gauge(
            "mycroft_jobs_active", "Jobs with a record within the job-end timeout."
        )
        self.detection_latency = histogram(
            "mycroft_detection_latency_seconds",
            "Fault onset to detection, per incident (trace clock).",
        )
        self.rca_latency = histogram(
            "mycroft_rca_latency_seconds",
            "Fault onset to first root cause, per incident (trace clock).",
        )

    def write(self, record: SinkRecord) -> None:
        """Update the metrics from one record; re-delivery changes nothing.

        Raises:
            SinkError: not retryable, after :meth:`close`.
        """
        if self._closed:
            raise SinkError("PrometheusSink is closed", retryable=False)
        self.job_alive(record.job_id)
        if isinstance(record, Anomaly):
            self._anomaly(record)
        elif isinstance(record, RootCause):
            self._root_cause(record)
        self.expire()

    def job_alive(self, job_id: str) -> None:
        """Note a record of ``job_id`` now (the service calls it per heartbeat)."""
        if job_id not in self._jobs:
            for kind in _KINDS:
                self.anomalies.labels(job_id, kind)
                self.incidents.labels(job_id, kind)
                self.open.labels(job_id, kind)
            self.revisions.labels(job_id)
        self._jobs[job_id] = self._clock()
        self.jobs.set(len(self._jobs))

    def _anomaly(self, a: Anomaly) -> None:
        if a.anomaly_id in self._seen:
            return
        self._seen[a.anomaly_id] = None
        if len(self._seen) > _SEEN_ANOMALIES:
            self._seen.popitem(last=False)
        self.anomalies.labels(a.job_id, a.kind.value).inc()

    def _root_cause(self, rc: RootCause) -> None:
        old = self._open.get(rc.incident_id)
        if old is not None and rc.revision <= old.revision:
            return  # a duplicate or an older revision delivered again
        if rc.revision <= self._ended.get(rc.incident_id, -1):
            return  # a revision of an incident closed since
        if rc.is_closed:
            self._end_incident(rc)
            return
        if old is None:
            self.incidents.labels(rc.job_id, rc.kind.value).inc()
        else:
            self._forget(rc.incident_id, old)
        if rc.revision == 0:
            kind = rc.kind.value
            self.detection_latency.labels(kind).observe(_since(rc, rc.detected_ns))
            self.rca_latency.labels(kind).observe(_since(rc, rc.resolved_ns))
        self.revisions.labels(rc.job_id).inc()
        best = rc.culprits[0] if rc.culprits else None
        entry = _Open(
            rc.job_id, rc.kind.value, rc.revision, _info_labels(rc, best),
            _reason(best), self._clock(), not rc.states_closure,
        )  # fmt: skip
        self._open[rc.incident_id] = entry
        self.open.labels(entry.job, entry.kind).inc()
        if best is not None:
            self.info.labels(*entry.info).set(1)
            self.reason.labels(rc.job_id, rc.incident_id, entry.reason).set(1)
            self.confidence.labels(rc.job_id, rc.incident_id).set(best.confidence)

    def _end_incident(self, rc: RootCause) -> None:
        """Apply a closed revision: its incident's series go, for good."""
        self._ended[rc.incident_id] = rc.revision
        if len(self._ended) > _ENDED_INCIDENTS:
            self._ended.popitem(last=False)
        self.revisions.labels(rc.job_id).inc()
        self.close_incident(rc.incident_id)

    def _forget(self, incident_id: str, entry: _Open) -> None:
        self.open.labels(entry.job, entry.kind).dec()
        if entry.info:
            self.info.remove(*entry.info)
            self.reason.remove(entry.job, incident_id, entry.reason)
            self.confidence.remove(entry.job, incident_id)

    def close_incident(self, incident_id: str) -> bool:
        """Close one incident now; return whether it was open."""
        entry = self._open.pop(incident_id, None)
        if entry is None:
            return False
        self._forget(incident_id, entry)
        return True

    def expire(self) -> list[str]:
        """Close the incidents of silent jobs, and idle ones of writers that
        never close them (``incident_ttl_s``); end silent jobs; return the
        closed incidents."""
        now = self._clock()
        ended = {j for j, t in self._jobs.items() if t < now - self._job_end_s}
        stale = [
            i for i, e in self._open.items()
            if e.job in ended or (e.ttl and e.updated_s < now - self._ttl_s)
        ]  # fmt: skip
        for incident_id in stale:
            self.close_incident(incident_id)
        for job in ended:
            self._end_job(job)
        return stale

    def _end_job(self, job: str) -> None:
        """Remove every series of ``job``; its history stays in Prometheus."""
        del self._jobs[job]
        for kind in _KINDS:
            for family in (self.anomalies, self.incidents, self.open):
                family.remove(job, kind)
        self.revisions.remove(job)
        self.jobs.set(len(self._jobs))

    @property
    def open_incidents(self) -> frozenset[str]:
        """Ids of the incidents open now."""
        return frozenset(self._open)

    @property
    def active_jobs(self) -> frozenset[str]:
        """Jobs seen within the job-end timeout."""
        return frozenset(self._jobs)

    def flush(self) -> None:
        """Expire idle incidents and jobs; metrics are visible as soon as set."""
        self.expire()

    def close(self) -> None:
        """Refuse later writes; the registry keeps its last values."""
        self._closed = True


def _since(rc: RootCause, t_ns: int) -> float:
    return max(0.0, (t_ns - rc.onset_ns) / 1e9)


def flow_label(best: Culprit) -> str:
    """``"33->41 ch2"`` for a culprit naming a flow; ``""`` otherwise."""
    if best.peer is None:
        return ""
    channel = "" if best.channel is None else f" ch{best.channel}"
    return f"{best.rank}->{best.peer}{channel}"


def _reason(best: Culprit | None) -> str:
    if best is None:
        return ""
    text = " ".join(best.reason.split())
    if len(text) > REASON_MAX_CHARS:
        text = text[: REASON_MAX_CHARS - 3] + "..."
    return text


def _info_labels(rc: RootCause, best: Culprit | None) -> tuple[str, ...]:
    """Label values of the info series of ``rc``; empty without culprits."""
    if best is None:
        return ()
    return (
        rc.job_id, rc.incident_id, str(best.rank), best.host,
        best.component.value, best.kind.value, flow_label(best), best.scope,
        best.subject(),
    )  # fmt: skip
