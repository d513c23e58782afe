"""Throughput of the Faust stream worker in rank-state records/s, with lag.

One record = one rank x communicator x tick (an ``rc`` row of a StateBatch).
Synthetic healthy jobs: H hosts x 8 ranks, each rank in C communicators, one
in-flight op with 2 flows per rank x comm; one StateBatch per host per tick.
The producer paces ticks at a target rows/s; the worker logs rows/s and the
worst consumer lag (now - Kafka timestamp at decode) every second.

    python bench/streams_throughput.py [--bootstrap H:P] [--rate 60000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from mycroft.kafka_client import producer_config
from mycroft.schemas.codec import Codec
from mycroft.schemas.columns import FLOW_COLUMNS, OP_COLUMNS, RC_COLUMNS, empty
from mycroft.schemas.records import BatchHeader, StateBatch
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.faust_topics import ensure_topics
from mycroft.streams.worker_process import WorkerProcess
from mycroft.topics import TopicSet, partition_for

T0 = 1_800_000_000_000_000_000
TICK = 100_000_000
STATS = re.compile(r"stats rows_per_s=(\d+) max_lag_s=([\d.]+)")


def host_batch(job: str, host: int, tick: int, ranks: int, comms: int) -> StateBatch:
    n = ranks * comms
    rank = np.repeat(np.arange(host * ranks, (host + 1) * ranks, dtype=np.int32), comms)
    comm = np.tile(np.arange(comms, dtype=np.uint64) + 0x1000, ranks)
    rc = empty(RC_COLUMNS, n)
    rc["rank"], rc["comm"] = rank, comm
    rc["issued_seq"], rc["done_seq"] = tick, tick - 1
    rc["seen_ns"] = T0 + tick * TICK
    op = empty(OP_COLUMNS, n)
    op["rank"], op["comm"], op["seq"] = rank, comm, tick
    op["bytes"], op["nflows"] = 1 << 20, 2
    op["issue_ns"] = op["start_ns"] = T0 + tick * TICK - 50_000_000
    flow = empty(FLOW_COLUMNS, 2 * n)
    flow["channel"] = np.tile([0, 1], n)
    flow["peer"] = np.repeat((rank + 1) % (ranks * 64), 2)
    flow["total"], flow["gpu_ready"], flow["transmitted"], flow["done"] = 16, 12, 10, 8
    flow["last_ns"] = T0 + tick * TICK
    header = BatchHeader(job, f"h{host}", 1, tick, T0 + tick * TICK, 100)
    return StateBatch(header, rc, op, flow)


def run(
    bootstrap: str,
    workers: int,
    rate: float,
    seconds: float,
    hosts: int,
    comms: int,
    tmp: Path,
) -> dict[str, object]:
    app_id = f"bench-{uuid.uuid4().hex[:8]}"
    s = StreamSettings(
        bootstrap,
        app_id=app_id,
        prefix=f"{app_id}.",
        partitions=max(workers, 1),
        data_dir=str(tmp / app_id),
        snapshot_interval_s=1.0,
        stats_interval_s=1.0,
        rates=False,
    )
    ensure_topics(s)
    topics = TopicSet(s.prefix, s.partitions)
    jobs = [f"job{i}" for i in range(64)]
    jobs = [j for j in jobs if partition_for(j, s.partitions) == 0][:2] + (
        [j for j in jobs if partition_for(j, s.partitions) == 1][:2]
        if workers > 1
        else []
    )
    logs = [tmp / f"{app_id}-w{i}.log" for i in range(workers)]
    procs = [WorkerProcess(s, log) for log in logs]
    for proc in procs:
        proc.start(60)
    time.sleep(2.0)
    from confluent_kafka import Producer  # noqa: PLC0415

    producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
    codec = Codec()
    rows_per_round = len(jobs) * hosts * 8 * comms
    period = rows_per_round / rate
    sent_rows, t_start, tick = 0, time.monotonic(), 1
    while time.monotonic() - t_start < seconds:
        for job in jobs:
            p = partition_for(job, s.partitions)
            for h in range(hosts):
                value = codec.encode(host_batch(job, h, tick, 8, comms))
                producer.produce(topics.state, value, job.encode(), partition=p)
                producer.poll(0)
        sent_rows += rows_per_round
        tick += 1
        delay = t_start + tick * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    producer.flush(30)
    produce_s = time.monotonic() - t_start
    time.sleep(3.0)
    for proc in procs:
        proc.stop(30)
    per_worker = []
    for log in logs:
        stats = [
            (float(a), float(b))
            for a, b in STATS.findall(log.read_text(errors="replace"))
        ]
        busy = [x for x in stats if x[0] > 0]
        steady = busy[1:-1] or busy
        per_worker.append(
            {
                "rows_per_s_mean": round(
                    float(np.mean([r for r, _ in steady])) if steady else 0.0
                ),
                "rows_per_s_max": max((r for r, _ in steady), default=0),
                "max_lag_s": max((lag for _, lag in steady), default=0.0),
                "samples": len(steady),
            }
        )
    return {
        "workers": workers,
        "jobs": len(jobs),
        "hosts_per_job": hosts,
        "ranks_per_host": 8,
        "comms_per_rank": comms,
        "rows_per_message": 8 * comms,
        "target_rows_per_s": rate,
        "offered_rows_per_s": round(sent_rows / produce_s),
        "seconds": round(produce_s, 1),
        "per_worker": per_worker,
        "total_rows_per_s": sum(w["rows_per_s_mean"] for w in per_worker),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default=os.environ.get("MYCROFT_TEST_BROKER", ""))
    ap.add_argument("--rate", type=float, default=60_000)
    ap.add_argument(
        "--rate2", type=float, default=0, help="offered rate with 2 workers"
    )
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--comms", type=int, default=8)
    ap.add_argument("--out", default="bench/results/streams_throughput.json")
    args = ap.parse_args(argv)
    if not args.bootstrap:
        raise SystemExit("--bootstrap or MYCROFT_TEST_BROKER is required")
    with tempfile.TemporaryDirectory() as tmp:
        one = run(
            args.bootstrap,
            1,
            args.rate,
            args.seconds,
            args.hosts,
            args.comms,
            Path(tmp),
        )
        print(json.dumps(one, indent=1))
        two = run(
            args.bootstrap,
            2,
            args.rate2 or 2 * args.rate,
            args.seconds,
            args.hosts,
            args.comms,
            Path(tmp),
        )
        print(json.dumps(two, indent=1))
    one_rate = float(one["total_rows_per_s"])  # type: ignore[arg-type]
    result = {
        "one_worker": one,
        "two_workers": two,
        "cpus": os.cpu_count(),
        "scaling_ratio": round(float(two["total_rows_per_s"]) / max(one_rate, 1.0), 2),
    }  # type: ignore[arg-type]
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("cpus", "scaling_ratio")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
