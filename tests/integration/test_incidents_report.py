"""``mycroft incidents show ID --report DIR``: the report from the topics.

The root cause and its anomalies come from their topics, the job's raw
records from the raw topics; the figures' data must be what the same
records give offline (``mycroft analyze --report``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

from mycroft import report
from mycroft.cli import main as cli_main
from mycroft.incidents import Source
from mycroft.kafka_client import RecordPublisher, create_topics
from mycroft.producers.tracefile import read_records
from mycroft.report.collect import Collector, IncidentData
from mycroft.report.from_topics import read_raw
from mycroft.schemas.records import Anomaly, RootCause
from mycroft.streams.analyze import Replay
from mycroft.topics import TopicSet

pytestmark = pytest.mark.integration

Published = tuple[str, str, RootCause, list[Anomaly], IncidentData]


@pytest.fixture(scope="module")
def published(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Published:
    """A simulated NIC outage on the raw topics, and what analyze found in it."""
    tmp = tmp_path_factory.mktemp("incident-report")
    trace = tmp / "run.trace"
    argv = [
        "simulate", "--ranks", "16", "--tp", "4", "--pp", "2", "--dp", "2",
        "--fault", "nic-down:at=5", "--duration", "10", "--job-id", "job-r",
        "--out", str(trace), "--truth", str(tmp / "truth.json"),
    ]  # fmt: skip
    assert cli_main(argv) == 0
    rp = Replay()
    for ts, rec in read_records(trace):
        rp.feed(ts, rec)
    anomalies, causes = rp.finish()
    (rc,) = causes.values()
    (offline,) = report.collect((r for _, r in read_records(trace)), [rc], anomalies)
    prefix = f"increport.{time.time_ns()}."
    topics = TopicSet(prefix, partitions=2)
    create_topics(kafka_bootstrap, topics)
    pub = RecordPublisher(kafka_bootstrap, topics)
    for _, rec in read_records(trace):
        pub.publish(rec)
    for finding in [*anomalies, rc]:
        pub.publish(finding)
    assert pub.flush(30) == 0
    return kafka_bootstrap, prefix, rc, anomalies, offline


def test_the_topics_give_the_offline_figures(published: Published) -> None:
    bootstrap, prefix, rc, anomalies, offline = published
    collector = Collector(rc, anomalies)
    taken = read_raw(Source(bootstrap, TopicSet(prefix, partitions=2)), collector)
    assert taken > 300
    live = collector.result()
    assert np.array_equal(live.ranks, offline.ranks)
    assert np.array_equal(live.progress, offline.progress, equal_nan=True)
    assert np.array_equal(live.flow.t_ns, offline.flow.t_ns)
    assert np.array_equal(live.flow.gtd, offline.flow.gtd)
    assert live.fired == offline.fired
    for a, b in zip(live.panels, offline.panels, strict=True):
        assert np.array_equal(a.value_s, b.value_s) and np.array_equal(a.hit, b.hit)


def test_show_writes_the_report(
    published: Published, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap, prefix, rc, _, _ = published
    out = tmp_path / "report"
    code = cli_main([
        "incidents", "show", rc.incident_id, "--bootstrap", bootstrap,
        "--topic-prefix", prefix, "--report", str(out),
    ])  # fmt: skip
    got = capsys.readouterr()
    assert code == 0, got.err
    assert f"report: {out / 'index.html'}" in got.err
    assert "no raw records" not in got.err
    html = (out / "index.html").read_text()
    assert rc.incident_id in html and rc.culprits[0].subject() in html
    names = re.findall(r'<img src="([^"]+)"', html)
    assert len(names) == 4 and all((out / n).stat().st_size > 10_000 for n in names)


def test_show_of_a_job_past_retention_says_so(
    published: Published, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap, _, rc, anomalies, _ = published
    prefix = f"increport.empty.{time.time_ns()}."
    topics = TopicSet(prefix, partitions=2)
    create_topics(bootstrap, topics)
    pub = RecordPublisher(bootstrap, topics)
    for finding in [*anomalies, rc]:
        pub.publish(finding)
    assert pub.flush(30) == 0
    code = cli_main([
        "incidents", "show", rc.incident_id, "--bootstrap", bootstrap,
        "--topic-prefix", prefix, "--report", str(tmp_path / "r"),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0
    assert "no raw records of job job-r" in err and "retention" in err
    assert (tmp_path / "r" / "index.html").exists()
