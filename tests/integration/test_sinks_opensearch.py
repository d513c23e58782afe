"""Root causes travel Kafka -> ``mycroft sinks`` -> a real OpenSearch.

Two revisions of two incidents, a stale re-delivery, and a second service run
that re-reads everything: ``_search`` still finds one document per incident,
at its latest revision.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mycroft.kafka_client import RecordPublisher, create_topics
from mycroft.topics import TopicSet
from tests.integration.sink_fixtures import opensearch_url
from tests.unit.sinks.records import anomaly, closed, root_cause

__all__ = ["opensearch_url"]  # the fixture, imported for pytest

pytestmark = pytest.mark.integration


def _search(url: str, index: str) -> dict[str, Any]:
    body = json.dumps({"query": {"match_all": {}}, "size": 100}).encode()
    req = urllib.request.Request(
        f"{url}/{index}/_search", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            reply: dict[str, Any] = json.load(resp)
            return reply
    except urllib.error.HTTPError as exc:
        exc.close()
        return {"hits": {"hits": []}}


def _service(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mycroft.sinks.service", *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise
    text = log.read_text()
    assert text.count("INFO __main__: stopped:") == text.count("forwarding "), text
    assert code == 0, text


def _wait_latest(url: str, index: str, want: dict[str, int], log: Path) -> list[Any]:
    deadline = time.monotonic() + 40
    while True:
        hits = _search(url, index)["hits"]["hits"]
        got = {h["_id"]: h["_source"]["revision"] for h in hits}
        if got == want:
            return list(hits)
        if time.monotonic() > deadline:
            pytest.fail(f"index holds {got}, want {want}\n{log.read_text()}")
        time.sleep(0.3)


def test_one_document_per_incident_after_revisions(
    kafka_bootstrap: str,
    opensearch_url: str,
    unique_name: Callable[..., str],
    tmp_path: Path,
) -> None:
    name = unique_name("sinks")
    topics = TopicSet(name + ".", partitions=2)
    create_topics(kafka_bootstrap, topics)
    publisher = RecordPublisher(kafka_bootstrap, topics)
    for record in (
        anomaly("a-1"),
        root_cause("i-1", 0), root_cause("i-2", 0, rank=5),
        root_cause("i-1", 1, rank=7), root_cause("i-2", 1, rank=6),
        closed(root_cause("i-2", 2, rank=6)),  # the fault cleared: closed
        root_cause("i-1", 0),  # stale re-delivery after the newer revision
    ):  # fmt: skip
        publisher.publish(record)
    assert publisher.flush(30) == 0

    index = f"{name}-rootcauses"
    args = ["--bootstrap", kafka_bootstrap, "--topic-prefix", name + ".",
            "--opensearch-url", opensearch_url, "--index-prefix", name,
            "--refresh", "wait_for"]  # fmt: skip
    log = tmp_path / "service.log"
    proc = _service([*args, "--group", f"{name}.g1"], log)
    try:
        hits = _wait_latest(opensearch_url, index, {"i-1": 1, "i-2": 2}, log)
    finally:
        _stop(proc, log)
    best = {h["_id"]: h["_source"]["best"]["rank"] for h in hits}
    assert best == {"i-1": 7, "i-2": 6}
    assert {h["_source"]["best"]["rules"][0] for h in hits} == {"frozen_ready_not_sent"}
    state = {h["_id"]: h["_source"]["state"] for h in hits}
    assert state == {"i-1": "open", "i-2": "closed"}
    ended = next(h["_source"] for h in hits if h["_id"] == "i-2")
    assert ended["close_reason"].startswith("quiet for 5.2 s of event time")
    with urllib.request.urlopen(f"{opensearch_url}/{index}/_mapping") as resp:  # noqa: S310
        fields = json.load(resp)[index]["mappings"]["properties"]
    assert fields["culprits"]["properties"]["rules"] == {"type": "keyword"}
    assert fields["state"] == {"type": "keyword"}
    assert fields["closed_ns"] == {"type": "long"}
    assert [
        h["_id"] for h in _search(opensearch_url, f"{name}-anomalies")["hits"]["hits"]
    ] == ["a-1"]

    # A new group re-reads every record: the documents stay as they are.
    # (The log is shared: only what the second service writes counts.)
    start = len(log.read_text())
    proc = _service([*args, "--group", f"{name}.g2"], log)
    try:
        deadline = time.monotonic() + 30
        while "(total 7)" not in log.read_text()[start:]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)
    finally:
        _stop(proc, log)
    assert "(total 7)" in log.read_text()[start:]
    _wait_latest(opensearch_url, index, {"i-1": 1, "i-2": 2}, log)
