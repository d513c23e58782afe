"""A recorded simulator trace replays into Kafka byte for byte."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from mycroft.producers.replay import main as replay_main
from mycroft.producers.tracefile import read_frames
from mycroft.topics import TopicSet

pytestmark = pytest.mark.integration


def test_simulated_trace_replays_into_kafka(
    kafka_bootstrap: str, unique_name: Callable[..., str], tmp_path: Path
) -> None:
    trace, truth = tmp_path / "job.trace.gz", tmp_path / "truth.json"
    subprocess.run(
        [sys.executable, "-m", "mycroft", "simulate", "--ranks", "16", "--tp", "8",
         "--pp", "2", "--duration", "3", "--fault", "gpu-hang:at=1", "--seed", "2",
         "--out", str(trace), "--truth", str(truth), "--job-id", "replayed"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    frames = list(read_frames(trace))
    expected = Counter((f.record_type, f.key, f.value) for f in frames)
    prefix = unique_name("replay") + "."
    args = [str(trace), "--kafka", kafka_bootstrap, "--topic-prefix", prefix]
    code = replay_main([*args, "--partitions", "2", "--create-topics"])
    assert code == 0

    topics = TopicSet(prefix, partitions=2)
    names = {topics.for_record(t): t for t in {f.record_type for f in frames}}
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": unique_name("g"),
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe(list(names))
    got: Counter[tuple[str, str, bytes]] = Counter()
    deadline = time.monotonic() + 60
    while sum(got.values()) < len(frames) and time.monotonic() < deadline:
        for m in consumer.consume(500, 0.5):
            if m.error() is None:
                got[(names[m.topic()], (m.key() or b"").decode(), m.value())] += 1
    consumer.close()
    assert got == expected
    assert not any(b"gpu-hang" in f.value for f in frames)  # no label in the trace
