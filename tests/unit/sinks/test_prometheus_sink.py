"""PrometheusSink: a fresh CollectorRegistry per test, read with get_sample_value."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mycroft.errors import SinkError
from mycroft.schemas.vocab import Component
from mycroft.sinks.base import Sink
from mycroft.sinks.prometheus import (
    METRIC_NAMES,
    REASON_MAX_CHARS,
    PrometheusSink,
    flow_label,
)
from tests.unit.sinks.records import anomaly, closed, root_cause


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sink(registry: CollectorRegistry, clock: Clock) -> PrometheusSink:
    return PrometheusSink(registry, incident_ttl_s=60.0, job_end_s=1e6, clock=clock)


def info(registry: CollectorRegistry, **labels: str) -> float | None:
    base = {"job_id": "job-1", "incident": "i-1", "kind": "hang", "host": "node-a",
            "component": "nic", "flow": f"{labels.get('rank')}->4",
            "scope": "rank"}  # fmt: skip
    base |= labels
    base.setdefault("culprit", f"rank {base.get('rank')} on {base['host']}")
    return registry.get_sample_value("mycroft_root_cause_info", base)


def test_is_a_sink(sink: PrometheusSink) -> None:
    assert isinstance(sink, Sink)


def test_anomalies_count_once_per_id_and_observe_no_latency(
    sink: PrometheusSink, registry: CollectorRegistry
) -> None:
    for record in (anomaly("a-1"), anomaly("a-1"), anomaly("a-2", latency_s=30)):
        sink.write(record)
    labels = {"job_id": "job-1", "kind": "hang"}
    assert registry.get_sample_value("mycroft_anomalies_total", labels) == 2
    count = "mycroft_detection_latency_seconds_count"
    assert registry.get_sample_value(count, {"kind": "hang"}) == 0


def test_latencies_are_per_incident_from_onset(
    sink: PrometheusSink, registry: CollectorRegistry
) -> None:
    """Onset -> detection 2 s and onset -> first root cause 2.5 s, once per
    incident: later revisions and other anomalies of it add nothing."""
    for record in (anomaly("a-1"), anomaly("a-2"), root_cause("i-1", 0),
                   root_cause("i-1", 1, rank=7), root_cause("i-2", 1)):  # fmt: skip
        sink.write(record)
    hang = {"kind": "hang"}
    get = registry.get_sample_value
    assert get("mycroft_detection_latency_seconds_count", hang) == 1
    assert get("mycroft_detection_latency_seconds_sum", hang) == pytest.approx(2.0)
    assert get("mycroft_rca_latency_seconds_count", hang) == 1
    assert get("mycroft_rca_latency_seconds_sum", hang) == pytest.approx(2.5)
    bucket = "mycroft_rca_latency_seconds_bucket"
    assert get(bucket, hang | {"le": "2.0"}) == 0
    assert get(bucket, hang | {"le": "3.0"}) == 1
    assert get("mycroft_incidents_total", {"job_id": "job-1", "kind": "hang"}) == 2
    # every kind's histogram exists from the start, at zero
    assert get("mycroft_rca_latency_seconds_count", {"kind": "slowdown"}) == 0


def test_root_cause_opens_incident_with_info_and_confidence(
    sink: PrometheusSink, registry: CollectorRegistry
) -> None:
    sink.write(root_cause())
    assert info(registry, rank="3", host="node-a", component="nic") == 1
    open_labels = {"job_id": "job-1", "kind": "hang"}
    assert registry.get_sample_value("mycroft_incidents_open", open_labels) == 1
    conf = {"job_id": "job-1", "incident": "i-1"}
    assert registry.get_sample_value("mycroft_culprit_confidence", conf) == 0.8
    assert registry.get_sample_value("mycroft_incidents_total", open_labels) == 1
    assert info(registry, rank="3", flow="3->4") == 1
    reason = {"job_id": "job-1", "incident": "i-1", "reason": "rank 3 never sent"}
    assert registry.get_sample_value("mycroft_root_cause_reason_info", reason) == 1


def test_revision_replaces_info_series(
    sink: PrometheusSink, registry: CollectorRegistry
) -> None:
    sink.write(root_cause(revision=0))
    sink.write(root_cause(revision=1, rank=7, host="node-b", component=Component.GPU))
    assert info(registry, rank="3", host="node-a", component="nic") is None
    assert info(registry, rank="7", host="node-b", component="gpu") == 1
    text = generate_latest(registry).decode()
    assert text.count("mycroft_root_cause_info{") == 1
    open_labels = {"job_id": "job-1", "kind": "hang"}
    assert registry.get_sample_value("mycroft_incidents_open", open_labels) == 1
    assert registry.get_sample_value("mycroft_incidents_total", open_labels) == 1
    rca = "mycroft_rca_latency_seconds_count"
    assert registry.get_sample_value(rca, {"kind": "hang"}) == 1


def test_older_or_repeated_revision_is_ignored(
    sink: PrometheusSink, registry: CollectorRegistry
) -> None:
    sink.write(root_cause(revision=1, rank=7))
    sink.write(root_cause(revision=0, rank=3))
    sink.write(root_cause(revision=1, rank=7))
    assert info(registry, rank="7", host="node-a", component="nic") == 1
    assert info(registry, rank="3", host="node-a", component="nic") is None
    revisions = "mycroft_root_cause_revisions_total"
    assert registry.get_sample_value(revisions, {"job_id": "job-1"}) == 1


def test_flow_and_reason_labels() -> None:
    culprit = root_cause().culprits[0]
    assert flow_label(replace(culprit, channel=2)) == "3->4 ch2"
    assert flow_label(culprit) == "3->4"
    assert flow_label(replace(culprit, peer=None)) == ""
    registry = CollectorRegistry()
    sink = PrometheusSink(registry)
    long_reason = "word " * 100
    sink.write(replace(root_cause(), culprits=(replace(culprit, reason=long_reason),)))
    (sample,) = [
        s for m in registry.collect() if m.name == "mycroft_root_cause_reason_info"
        for s in m.samples
    ]  # fmt: skip
    assert len(sample.labels["reason"]) == REASON_MAX_CHARS
    assert sample.labels["reason"].startswith("word word ")
    assert sample.labels["reason"].endswith("...")


def test_ended_job_closes_its_incidents_and_drops_its_series(
    registry: CollectorRegistry, clock: Clock
) -> None:
    sink = PrometheusSink(registry, incident_ttl_s=600, job_end_s=30, clock=clock)
    sink.job_alive("job-1")
    labels = {"job_id": "job-1", "kind": "hang"}
    assert registry.get_sample_value("mycroft_incidents_total", labels) == 0
    sink.write(root_cause("i-1"))
    sink.write(root_cause("i-9", job="job-2"))
    for _ in range(5):  # job-1 still heartbeats while hung: the incident stays
        clock.now += 20
        sink.job_alive("job-1")
        sink.flush()
    assert sink.open_incidents == frozenset({"i-1"})
    assert sink.active_jobs == frozenset({"job-1"})
    job2 = {**labels, "job_id": "job-2"}
    assert registry.get_sample_value("mycroft_incidents_total", job2) is None
    clock.now += 31
    sink.flush()
    assert sink.open_incidents == frozenset()
    assert registry.get_sample_value("mycroft_incidents_open", labels) is None
    assert info(registry, rank="3") is None
    assert registry.get_sample_value("mycroft_jobs_active") == 0


def test_idle_incident_of_an_older_writer_expires(
    sink: PrometheusSink, registry: CollectorRegistry, clock: Clock
) -> None:
    """A RootCause.1-3 writer never sends a closed revision: the TTL closes."""
    sink.write(replace(root_cause("i-1"), states_closure=False))
    clock.now += 30
    sink.write(replace(root_cause("i-2"), states_closure=False))
    clock.now += 31
    sink.flush()
    assert sink.open_incidents == frozenset({"i-2"})
    assert info(registry, rank="3", host="node-a", component="nic") is None
    assert info(registry, incident="i-2", rank="3", host="node-a", component="nic")
    open_labels = {"job_id": "job-1", "kind": "hang"}
    assert registry.get_sample_value("mycroft_incidents_open", open_labels) == 1
    assert sink.close_incident("i-2")
    assert not sink.close_incident("i-2")
    assert registry.get_sample_value("mycroft_incidents_open", open_labels) == 0


def test_metric_names_follow_the_house_rules(sink: PrometheusSink) -> None:
    families = {m.name for m in sink.registry.collect()}
    exposed = {n + "_total" if n + "_total" in METRIC_NAMES else n for n in families}
    assert exposed == set(METRIC_NAMES)
    assert all(n.startswith("mycroft_") for n in METRIC_NAMES)


def test_second_sink_on_same_registry_is_refused(registry: CollectorRegistry) -> None:
    PrometheusSink(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        PrometheusSink(registry)


def test_closed_sink_refuses_writes(sink: PrometheusSink) -> None:
    sink.close()
    with pytest.raises(SinkError) as info_:
        sink.write(anomaly())
    assert not info_.value.retryable


def test_a_nic_culprit_is_exported_as_the_nic(
    sink: PrometheusSink, registry: CollectorRegistry
) -> None:
    rc = root_cause()
    nic = replace(rc.culprits[0], scope="nic", device="mlx5_1", ranks=(2, 3))
    sink.write(replace(rc, culprits=(nic,)))
    culprit = "NIC mlx5_1 of node-a (ranks 2, 3)"
    assert info(registry, rank="3", scope="nic", culprit=culprit) == 1


def test_a_closed_revision_removes_the_incident_series(
    sink: PrometheusSink, registry: CollectorRegistry
) -> None:
    open_labels = {"job_id": "job-1", "kind": "hang"}
    sink.write(root_cause("i-1", 0))
    assert info(registry, rank="3") == 1
    sink.write(closed(root_cause("i-1", 1)))
    assert sink.open_incidents == frozenset()
    assert info(registry, rank="3") is None
    confidence = {"job_id": "job-1", "incident": "i-1"}
    assert registry.get_sample_value("mycroft_culprit_confidence", confidence) is None
    assert registry.get_sample_value("mycroft_incidents_open", open_labels) == 0
    revisions = registry.get_sample_value(
        "mycroft_root_cause_revisions_total", {"job_id": "job-1"}
    )
    assert revisions == 2
    # re-delivered, the open revision does not reopen it
    sink.write(root_cause("i-1", 0))
    assert sink.open_incidents == frozenset() and info(registry, rank="3") is None
    incidents = {"job_id": "job-1", "kind": "hang"}
    assert registry.get_sample_value("mycroft_incidents_total", incidents) == 1


def test_an_incident_that_states_closure_outlives_the_ttl(
    sink: PrometheusSink, registry: CollectorRegistry, clock: Clock
) -> None:
    """A long incident without a new revision stays open until it closes."""
    sink.write(root_cause("i-1"))
    clock.now += 3600
    sink.flush()
    assert sink.open_incidents == frozenset({"i-1"})
    assert info(registry, rank="3") == 1


def test_a_closed_revision_first_seen_opens_nothing(
    sink: PrometheusSink, registry: CollectorRegistry
) -> None:
    """A sink started after the incident ended sees its closed revision only."""
    sink.write(closed(root_cause("i-1", 2)))
    sink.write(root_cause("i-1", 1))  # an older one, late
    assert sink.open_incidents == frozenset()
    labels = {"job_id": "job-1", "kind": "hang"}
    assert registry.get_sample_value("mycroft_incidents_total", labels) == 0
