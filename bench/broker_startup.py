"""Measure the local Kafka broker: start/stop time and JVM RSS, before and after load.

Usage: python bench/broker_startup.py [--runs 3] [--out FILE]
(the checked-in numbers: --out bench/results/broker_startup.json)

Each run starts a fresh KafkaBroker (KRaft format included), produces a small load,
then stops it. Jars are fetched first so Maven is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from mycroft.infra.kafka_broker import KafkaBroker, fetch_jars, kafka_version

MIB = 1024 * 1024


def _load(bootstrap: str, messages: int, size: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    payload = os.urandom(size)
    for index in range(messages):
        while True:
            try:
                producer.produce("bench.load", value=payload, key=str(index).encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def _run(messages: int, size: int) -> dict[str, float]:
    broker = KafkaBroker()
    try:
        started = time.monotonic()
        bootstrap = broker.start()
        start_s = time.monotonic() - started
        rss_start = broker.rss_bytes() / MIB
        loaded = time.monotonic()
        _load(bootstrap, messages, size)
        load_s = time.monotonic() - loaded
        rss_load = broker.rss_bytes() / MIB
        stopping = time.monotonic()
        broker.stop()
        stop_s = time.monotonic() - stopping
    finally:
        broker.close()
    return {"start_s": start_s, "stop_s": stop_s, "load_s": load_s,
            "rss_mb_after_start": rss_start, "rss_mb_after_load": rss_load}  # fmt: skip


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "all": [round(value, 3) for value in values],
    }


def _java_version() -> str:
    done = subprocess.run(
        ["java", "-version"], check=False, capture_output=True, text=True
    )
    return done.stderr.splitlines()[0] if done.stderr else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024, help="bytes per message")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    fetch_jars()
    runs = [_run(args.messages, args.size) for _ in range(args.runs)]
    result = {
        "kafka_version": kafka_version(),
        "runs": args.runs,
        "heap_mb": 512,
        "load": {"messages": args.messages, "bytes_each": args.size},
        **{key: _summary([run[key] for run in runs]) for key in runs[0]},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "java": _java_version(),
        },  # fmt: skip
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", "utf-8")


if __name__ == "__main__":
    main()
