"""A real Prometheus scrapes the PrometheusSink's endpoint; PromQL finds the culprit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from mycroft.schemas.vocab import Component
from mycroft.sinks.prometheus import PrometheusSink
from tests.integration.sink_fixtures import StartPrometheus, start_prometheus
from tests.unit.sinks.records import anomaly, closed, root_cause

__all__ = ["start_prometheus"]  # the fixture, imported for pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def exporter() -> Iterator[tuple[PrometheusSink, str]]:
    registry = CollectorRegistry()
    sink = PrometheusSink(registry)
    server, thread = start_http_server(0, "127.0.0.1", registry=registry)
    yield sink, f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_promql_returns_current_culprit(
    exporter: tuple[PrometheusSink, str], start_prometheus: StartPrometheus
) -> None:
    sink, target = exporter
    sink.write(anomaly())
    sink.write(root_cause("i-1", 0, rank=3, host="node-a"))
    sink.write(root_cause("i-1", 1, rank=7, host="node-b", component=Component.GPU))
    prom = start_prometheus([target])
    prom.wait_for_target(target, timeout_s=20)

    expr = 'mycroft_root_cause_info{incident="i-1"}'
    (series,) = prom.wait_for(expr)
    labels = series["metric"]
    assert (labels["rank"], labels["host"], labels["component"]) == (
        "7",
        "node-b",
        "gpu",
    )
    assert labels["job_id"] == "job-1" and labels["kind"] == "hang"

    sink.write(root_cause("i-1", 2, rank=9, host="node-c"))
    prom.wait_for(f'{expr[:-1]},rank="9"}}', timeout_s=10)
    prom.wait_for(f'absent({expr[:-1]},rank="7"}})', timeout_s=10)  # stale marker
    (opened,) = prom.query('sum(mycroft_incidents_open{job_id="job-1"})')
    assert float(opened["value"][1]) == 1
    (count,) = prom.query("sum(mycroft_anomalies_total)")
    assert float(count["value"][1]) == 1


def test_a_closed_revision_clears_the_culprit_series(
    exporter: tuple[PrometheusSink, str], start_prometheus: StartPrometheus
) -> None:
    """The fault cleared: the closed revision removes the series that
    ``MycroftIncidentOpen`` fires on, at once rather than after the TTL."""
    sink, target = exporter
    sink.write(root_cause("i-1", 0, rank=3, host="node-a"))
    prom = start_prometheus([target])
    prom.wait_for_target(target, timeout_s=20)
    expr = 'mycroft_root_cause_info{incident="i-1"}'
    prom.wait_for(expr)
    sink.write(closed(root_cause("i-1", 1, rank=3, host="node-a")))
    prom.wait_for(f"absent({expr})", timeout_s=10)  # stale marker
    (opened,) = prom.query('sum(mycroft_incidents_open{job_id="job-1"})')
    assert float(opened["value"][1]) == 0
