"""Agents with ``--source sim``: each publishes its own host of one simulated job."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mycroft.kafka_client import DecodingConsumer, create_topics
from mycroft.schemas.records import Heartbeat, StateBatch, Topology
from mycroft.topics import TopicSet

pytestmark = pytest.mark.integration


def test_two_sim_agents_publish_their_own_hosts(
    kafka_bootstrap: str, unique_name: Callable[..., str], tmp_path: Path
) -> None:
    prefix = unique_name("simagent") + "."
    topics = TopicSet(prefix, partitions=1)
    create_topics(kafka_bootstrap, topics)
    procs = []
    start_s = f"{time.time():.3f}"  # both agents simulate the same job clock
    for host in ("node0000", "node0001"):
        truth = tmp_path / f"{host}.json"
        sim_args = f"--ranks 16 --tp 8 --pp 2 --duration 3 --seed 5 --truth {truth}"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "mycroft", "agent", "--source", "sim",
             "--sim-args", sim_args, "--host", host, "--job-id", "job-s",
             "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix,
             "--partitions", "1", "--spool-dir", str(tmp_path / f"spool-{host}"),
             "--duration-s", "5", "--metrics-port", "0", "--sim-start-s", start_s],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        ))  # fmt: skip
    for proc in procs:
        assert proc.wait(60) == 0
    consumer = DecodingConsumer(
        kafka_bootstrap, unique_name("g"),
        [topics.state, topics.topology, topics.heartbeat], topics.deadletter,
    )  # fmt: skip
    seen: dict[str, set[str]] = {
        "StateBatch": set(),
        "Topology": set(),
        "Heartbeat": set(),
    }
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and not all(
            len(v) == 2 for v in seen.values()
        ):
            for _, record in consumer.poll(timeout_s=0.5):
                if isinstance(record, StateBatch):
                    seen["StateBatch"].add(record.header.host)
                elif isinstance(record, Topology | Heartbeat):
                    seen[type(record).__name__].add(record.host)
    finally:
        consumer.close()
    assert seen == {k: {"node0000", "node0001"} for k in seen}
    assert (tmp_path / "node0000.json").read_text() == (
        tmp_path / "node0001.json"
    ).read_text()
