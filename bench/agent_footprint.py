"""Footprint of the node agent on an 8-GPU host at 100 ms sampling.

One writer process writes 8 rings (one per GPU rank) at a realistic rate:
each rank runs one collective every ``--op-ms`` with ``--flows`` flows, and
every 100 ms writes a FLOW_PROGRESS snapshot per flow of its in-flight op,
then FLOW_DONE per flow and OP_DONE. The agent runs as its own process
(``mycroft agent``) against a Kafka broker (``--bootstrap``, or a local one
started with mycroft.infra.kafka_broker), and we sample its CPU time and RSS
from /proc. Also measured: Python ring writer ns/record, and Kafka bytes per
training iteration per host (value bytes of all topics / iterations).

    python bench/agent_footprint.py [--seconds 30] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer

from mycroft.infra.kafka_broker import KafkaBroker
from mycroft.kafka_client import create_topics
from mycroft.producers import ring_layout as L
from mycroft.producers.ring import RingWriter
from mycroft.topics import TopicSet

GPUS = 8
COMM = 0x5EED


def writer_ns_per_record(n: int = 200_000) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        w = RingWriter(Path(d) / "b.ring", 0, 1 << 16)
        t = time.perf_counter_ns()
        for i in range(n):
            w.flow_progress(i, COMM, i, 1, 0, 2, 8, 4, 3, 2)
        fast = (time.perf_counter_ns() - t) / n
        rec = L.OpIssued(1, COMM, 0, 1 << 20, 0, 1, 1, 8)
        t = time.perf_counter_ns()
        for _ in range(n):
            w.write(rec)
        generic = (time.perf_counter_ns() - t) / n
        w.close()
    return {"flow_progress_fast_path_ns": fast, "generic_write_ns": generic}


def run_writers(
    ring_dir: str, seconds: float, op_ms: int, flows: int, q: mp.Queue
) -> None:
    rings = [
        RingWriter(Path(ring_dir) / f"rank{r}.ring", r, 1 << 16, r) for r in range(GPUS)
    ]
    for r, w in enumerate(rings):
        w.write(L.Comm(time.time_ns(), COMM, GPUS, r, flows, r))
    seq, n = 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.time_ns()
        for w in rings:
            w.write(L.OpIssued(t0, COMM, seq, 64 << 20, 0, 1, 1, flows))
        steps = max(1, op_ms // 100)
        for k in range(1, steps + 1):  # 100 ms state snapshots while in flight
            now = time.time_ns()
            for w in rings:
                for f in range(flows):
                    d = 16 * k // steps
                    w.flow_progress(
                        now, COMM, seq, f // 2, f % 2, (f + 1) % GPUS, 16, d, d, d
                    )
            time.sleep(0.1)
        now = time.time_ns()
        for w in rings:
            for f in range(flows):
                w.write(
                    L.FlowDone(now, COMM, seq, t0, f // 2, f % 2, (f + 1) % GPUS, 16)
                )
            w.write(L.OpDone(now, COMM, seq, t0, flows))
        seq += 1
        n += 1
    for w in rings:
        w.close()
    q.put(n)


def proc_stats(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu_s, rss


def topic_bytes(bootstrap: str, topics: TopicSet) -> int:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{os.getpid()}",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([topics.state, topics.completion, topics.heartbeat, topics.topology])
    total, idle = 0, time.monotonic()
    while time.monotonic() - idle < 4:
        for m in c.consume(1000, 0.5):
            if m.error() is None:
                total += len(m.value() or b"")
                idle = time.monotonic()
    c.close()
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument(
        "--op-ms", type=int, default=500, help="one collective per rank per N ms"
    )
    ap.add_argument("--flows", type=int, default=16, help="flows per op per rank")
    ap.add_argument("--bootstrap", default="")
    ap.add_argument("--out", default="bench/results/agent_footprint.json")
    a = ap.parse_args()
    broker = None
    if not a.bootstrap:
        broker = KafkaBroker()
        a.bootstrap = broker.start()
    prefix = f"bench{os.getpid()}."
    topics = TopicSet(prefix, 1)
    create_topics(a.bootstrap, topics)
    tmp = tempfile.TemporaryDirectory(dir="/dev/shm")
    spool = tempfile.TemporaryDirectory()
    q: mp.Queue = mp.Queue()
    wp = mp.Process(target=run_writers, args=(tmp.name, a.seconds, a.op_ms, a.flows, q))
    wp.start()
    time.sleep(0.5)
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mycroft",
            "agent",
            "--job-id",
            "bench",
            "--ring-dir",
            tmp.name,
            "--spool-dir",
            spool.name,
            "--bootstrap",
            a.bootstrap,
            "--topic-prefix",
            prefix,
            "--partitions",
            "1",
            "--log-level",
            "WARNING",
        ]
    )
    time.sleep(3)  # imports and warm-up are not steady state
    cpu0, _ = proc_stats(agent.pid)
    t0, rss_max = time.monotonic(), 0
    while wp.is_alive():
        time.sleep(1)
        rss_max = max(rss_max, proc_stats(agent.pid)[1])
    cpu1, rss = proc_stats(agent.pid)
    wall = time.monotonic() - t0
    iterations = q.get()
    wp.join()
    agent.terminate()
    agent.wait(30)
    nbytes = topic_bytes(a.bootstrap, topics)
    result = {
        "setup": {
            "gpus": GPUS,
            "sampling_ms": 100,
            "op_ms": a.op_ms,
            "flows_per_op": a.flows,
            "seconds": a.seconds,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "agent_cpu_percent_of_one_core": 100 * (cpu1 - cpu0) / wall,
        "agent_rss_mb": max(rss, rss_max) / 2**20,
        "ring_writer": writer_ns_per_record(),
        "iterations": iterations,
        "kafka_value_bytes_total": nbytes,
        "bytes_per_iteration_per_host": nbytes / max(iterations, 1),
        "paper_bytes_per_iteration_per_host": 46_800,
        "goals": {"cpu_percent": 2.0, "rss_mb": 150},
    }
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    tmp.cleanup()
    spool.cleanup()
    if broker is not None:
        broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
