"""The demo's pipeline against a real Prometheus and a real Alertmanager.

A local broker, a stream worker, ``mycroft sinks`` serving /metrics, and
a simulated job whose GPU hangs. Prometheus scrapes the sinks every second
and evaluates ``infra/prometheus/mycroft-alerts.yml``; its alerts go to an
Alertmanager that posts them to a webhook served by this test.

Checked: every panel query of every dashboard in ``infra/grafana/`` returns
data through Prometheus' HTTP API (as Grafana runs it: a range query over
the run); ``MycroftIncidentOpen`` reaches the webhook naming the job, the
culprit's component and rank; the job's end (no heartbeat for ``--job-end``)
closes the incident, and the webhook receives the resolution. The ground
truth is read only to compare.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from mycroft.errors import MycroftError
from mycroft.infra import _kafka_props as kp
from mycroft.infra.alertmanager import AlertmanagerServer
from mycroft.kafka_client import create_topics
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.worker_process import WorkerProcess
from mycroft.topics import TopicSet
from tests.integration.sink_fixtures import StartPrometheus, start_prometheus
from tests.services import unavailable

__all__ = ["start_prometheus"]  # the fixture, imported for pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
RULES = ROOT / "infra" / "prometheus" / "mycroft-alerts.yml"
DASHBOARDS = sorted((ROOT / "infra" / "grafana").glob("*.json"))
JOB_END_S = 8.0
FAULT_AT_S = 5


class Webhook:
    """An HTTP server on loopback that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", 0))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer((kp.HOST, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://{kp.HOST}:{self.server.server_port}/alerts"

    def alerts(self, status: str, name: str = "MycroftIncidentOpen") -> list[Any]:
        """Alerts named ``name`` posted with ``status`` (firing, resolved)."""
        return [
            a for b in self.bodies for a in b["alerts"]
            if a["status"] == status and a["labels"]["alertname"] == name
        ]  # fmt: skip

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def alertmanager(webhook: Webhook, tmp_path: Path) -> Iterator[AlertmanagerServer]:
    server = AlertmanagerServer(webhook.url, tmp_path / "alertmanager")
    error = None
    try:
        server.start()
    except MycroftError as exc:
        error = str(exc)
    if error is not None:
        server.close()
        unavailable("Alertmanager", error)
    yield server
    server.close()


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mycroft", *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _until(check: Callable[[], Any], timeout_s: float, what: str, logs: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            tails = "\n".join(
                f"--- {p.name}:\n{p.read_text('utf-8', 'replace')[-1500:]}"
                for p in sorted(logs.glob("*.log"))
            )
            pytest.fail(
                f"timed out after {timeout_s:.0f} s waiting for {what}\n{tails}"
            )
        time.sleep(0.5)
    return found


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title / refId, expr)`` of every target of every panel."""
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((f"{panel['title']} / {target['refId']}", target["expr"]))
    return found


def grafana_vars(expr: str, job: str) -> str:
    """Substitute the dashboard's variables as Grafana would for one job."""
    expr = expr.replace("$__rate_interval", "4s").replace("$__interval", "1s")
    return re.sub(r"\$\{?job\}?", lambda _: job, expr)  # job ids: [a-z0-9-]


def _has_finite_value(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(v)) for s in result for _, v in s["values"])


def test_dashboards_and_alerts_on_a_live_hang(
    kafka_bootstrap: str,
    unique_name: Callable[..., str],
    start_prometheus: StartPrometheus,
    alertmanager: AlertmanagerServer,
    webhook: Webhook,
    tmp_path: Path,
) -> None:
    name = unique_name("alerts")
    topics = TopicSet(name + ".")  # the simulator's partition counts
    create_topics(kafka_bootstrap, topics)
    job = "job-" + name.rsplit(".", 1)[1]
    settings = StreamSettings(
        kafka_bootstrap, app_id=name, prefix=name + ".",
        partitions=topics.partitions("raw.state"), data_dir=str(tmp_path / "faust"),
    )  # fmt: skip
    worker = WorkerProcess(settings, tmp_path / "worker.log")
    listen = f"{kp.HOST}:{kp.pick_free_ports().client}"
    sinks_log = tmp_path / "sinks.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        worker.start(90)
        procs.append(_spawn(["sinks", "--bootstrap", kafka_bootstrap,
                             "--topic-prefix", name + ".", "--group", name + ".sinks",
                             "--prometheus-listen", listen, "--lag-group", name,
                             "--job-end", str(JOB_END_S)], sinks_log))  # fmt: skip
        prom = start_prometheus([listen], [RULES], [alertmanager.address])
        prom.wait_for_target(listen, timeout_s=30)
        started = time.time()
        truth = tmp_path / "truth.json"
        sim = _spawn(["simulate", "--ranks", "64", "--tp", "8", "--pp", "2",
                      "--dp", "4", "--seed", "7", "--duration", "14",
                      "--fault", f"gpu-hang:at={FAULT_AT_S}",
                      "--kafka", kafka_bootstrap,
                      "--topic-prefix", name + ".", "--truth", str(truth),
                      "--job-id", job], tmp_path / "simulate.log")  # fmt: skip
        procs.append(sim)

        fired = _until(lambda: webhook.alerts("firing"), 60, "a firing alert", tmp_path)
        info = prom.query(f'mycroft_root_cause_info{{job_id="{job}"}}')
        assert sim.wait(60) == 0, (tmp_path / "simulate.log").read_text()
        fault = json.loads(truth.read_text())["faults"][0]
        alert = fired[0]
        assert alert["labels"]["alertname"] == "MycroftIncidentOpen"
        assert alert["labels"]["job_id"] == job
        assert alert["labels"]["severity"] == "critical"
        assert alert["labels"]["component"] == fault["component"] == "gpu"
        assert f"rank {fault['rank']} on " in alert["annotations"]["description"]
        assert [s["metric"]["rank"] for s in info] == [str(fault["rank"])]
        assert alertmanager.alerts(), "Alertmanager's API holds no alert"

        # Every panel, while the job's data is in Prometheus.
        prom.wait_for('mycroft_rca_latency_seconds_count{kind="hang"} > 0')
        for path in DASHBOARDS:
            dashboard = json.loads(path.read_text("utf-8"))
            queries = panel_queries(dashboard)
            assert queries, path
            for where, expr in queries:
                result = prom.query_range(grafana_vars(expr, job), started, time.time())
                assert _has_finite_value(result), f"{path.name}: {where}: {expr}"
        jobs = prom.api("label/job_id/values", **{"match[]": "mycroft_anomalies_total"})
        assert job in jobs
        (rca,) = prom.query('mycroft_rca_latency_seconds_sum{kind="hang"}')
        (detect,) = prom.query('mycroft_detection_latency_seconds_sum{kind="hang"}')
        assert float(rca["value"][1]) >= float(detect["value"][1]) > 0
        # The worker-lag rule's join matches the series the sinks export.
        lag_s = prom.wait_for(
            f'sum by (group, topic) (mycroft_consumer_lag_records{{group="{name}"}})'
            " / on (topic) group_left"
            " sum by (topic) (rate(mycroft_topic_end_offset[2m]))"
        )
        assert topics.state in {s["metric"]["topic"] for s in lag_s}

        # The job ended: its incident closes and the alert resolves.
        resolved = _until(
            lambda: webhook.alerts("resolved"), 60, "the resolution", tmp_path
        )
        assert resolved[0]["labels"]["job_id"] == job
        assert not prom.query(f'mycroft_incidents_open{{job_id="{job}"}}')
    finally:
        for proc in procs:
            _stop(proc)
        worker.stop()
    assert "Traceback" not in sinks_log.read_text(), sinks_log.read_text()
