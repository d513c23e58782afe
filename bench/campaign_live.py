"""Live fault campaign: simulated jobs -> real Kafka -> Faust workers -> scores.

Every run is a simulated training job published live (``mycroft simulate
--kafka``, paced to wall-clock time) into a real local broker, analyzed by
real ``mycroft streams worker`` processes (one consumer group), and scored
outside the pipeline against the simulator's truth (``bench/campaign/score.py``).
Several jobs run at once, as on a shared cluster; jobs are partitioned by id.
With ``--two-stage`` the workers are the two-stage deployment of
``streams/SCALING.md`` (one split worker, ``--workers`` stage-1 workers sharing
each job's ``--comm-groups``, one resolver): the path for jobs one worker
cannot carry.

Latencies are measured on Kafka: an anomaly's or root cause's time is the
broker timestamp of the record that carried it, and the onset is the truth's
onset on the same (wall-clock) trace clock.

``--speed S`` publishes S trace seconds per wall second (the workers get
``--trace-speed S`` and evaluate every 0.2 trace s): the way to run a job
larger than the machine's cores carry in real time (a 1,024-rank job needs
4-5 cores of stage-1 workers, ``streams/SCALING.md``). Broker timestamps
are then mapped back to the trace clock, ``start + (t - start) * S``, so the
latencies are in trace seconds; the pipeline's own wall-clock delays (Kafka,
polling, the evaluation period) shrink by S with them, which the results
state. Usage::

    python bench/campaign_live.py --ranks 64 --seeds 10 --concurrency 4
    python bench/campaign_live.py --ranks 1024 --seeds 1 --concurrency 1 --speed 0.25
    python bench/campaign_live.py --ranks 1024 --seeds 2 --first-seed 2 \
        --healthy-runs 0 --concurrency 1 --workers 1 --speed 0.25 --append
    python bench/campaign_live.py --ranks 1024 --seeds 1 --concurrency 1 --two-stage

Results: ``bench/results/campaign_live_<ranks>.json`` (rows and per-fault
aggregates) and ``bench/results/campaign_live_<ranks>_cdf.png``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign.score import score_run  # noqa: E402
from bench.campaign_offline import (  # noqa: E402
    HANG_KINDS,
    SHAPES,
    aggregate,
    fault_duration,
    plot,
    source_commit,
)
from mycroft.infra.kafka_broker import KafkaBroker  # noqa: E402
from mycroft.kafka_client import DecodingConsumer, create_topics  # noqa: E402
from mycroft.producers.sim.faults import FAULTS  # noqa: E402
from mycroft.schemas.records import Anomaly, RootCause  # noqa: E402
from mycroft.streams.analyze import to_json  # noqa: E402
from mycroft.streams.faust_settings import StreamSettings  # noqa: E402
from mycroft.streams.faust_topics import ensure_topics  # noqa: E402
from mycroft.streams.worker_process import WorkerProcess  # noqa: E402
from mycroft.topics import TopicSet, group_partition, partition_for  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 8


@dataclass
class Seen:
    """What one job produced on the output topics, with broker timestamps."""

    anomalies: dict[str, Anomaly] = field(default_factory=dict)
    causes: dict[str, RootCause] = field(default_factory=dict)
    first_cause_ms: dict[str, int] = field(default_factory=dict)
    last_cause_ms: dict[str, int] = field(default_factory=dict)
    anomaly_ms: dict[str, int] = field(default_factory=dict)


class Collector(threading.Thread):
    """Read the anomaly and root-cause topics into per-job ``Seen`` tables."""

    def __init__(self, bootstrap: str, topics: TopicSet) -> None:
        super().__init__(daemon=True)
        self.consumer = DecodingConsumer(
            bootstrap, f"campaign-{uuid.uuid4().hex[:8]}",
            [topics.anomaly, topics.rootcause], topics.deadletter,
        )  # fmt: skip
        self.jobs: dict[str, Seen] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            for msg, rec in self.consumer.poll(timeout_s=0.3):
                _, ts_ms = msg.timestamp()
                with self.lock:
                    self._add(rec, ts_ms)
        self.consumer.close()

    def _add(self, rec: Any, ts_ms: int) -> None:
        if isinstance(rec, Anomaly):
            seen = self.jobs.setdefault(rec.job_id, Seen())
            seen.anomalies.setdefault(rec.anomaly_id, rec)
            seen.anomaly_ms.setdefault(rec.anomaly_id, ts_ms)
        elif isinstance(rec, RootCause):
            seen = self.jobs.setdefault(rec.job_id, Seen())
            old = seen.causes.get(rec.incident_id)
            if old is None or rec.revision >= old.revision:
                seen.causes[rec.incident_id] = rec
                seen.last_cause_ms[rec.incident_id] = ts_ms
            seen.first_cause_ms.setdefault(rec.incident_id, ts_ms)


def _on_kafka(seen: Seen, start_s: float, speed: float) -> dict[str, Any]:
    """The analyze JSON of one job, with times replaced by broker timestamps
    on the trace clock (a job paced at ``speed`` started at ``start_s``)."""

    def trace_s(ms: int) -> float:
        return start_s + (ms / 1e3 - start_s) * speed

    anomalies = list(seen.anomalies.values())
    doc = to_json(anomalies, seen.causes)
    for row, a in zip(doc["anomalies"], anomalies, strict=True):
        row["detected_at_s"] = trace_s(seen.anomaly_ms[a.anomaly_id])
    for row in doc["root_causes"]:
        inc = row["incident_id"]
        first_s = trace_s(seen.first_cause_ms[inc])
        row["detected_at_s"] = min(row["detected_at_s"], first_s)
        row["first_resolved_at_s"] = first_s
        row["resolved_at_s"] = trace_s(seen.last_cause_ms[inc])
    return doc


def paper_comparison(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The paper's headline shares on these runs (onset -> record on Kafka):
    hangs detected within 15 s, root causes within 20 s and within 60 s."""
    faulty = [r for r in rows if r["fault"] != "healthy"]
    hangs = [r for r in faulty if r.get("kind_truth") in HANG_KINDS]

    def share(runs: list[dict[str, Any]], key: str, limit: float) -> float | None:
        if not runs:
            return None
        ok = [r for r in runs if r[key] is not None and r[key] <= limit]
        return round(len(ok) / len(runs), 3)

    return {
        "hangs_detected_within_15s": share(hangs, "detection_latency_s", 15.0),
        "root_causes_within_20s": share(faulty, "rca_latency_s", 20.0),
        "root_causes_within_60s": share(faulty, "rca_latency_s", 60.0),
    }


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "mycroft", *args],
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def _start_workers(
    a: argparse.Namespace, bootstrap: str, work: Path
) -> list[WorkerProcess]:
    """Start the single-stage workers, or the stages of the two-stage path
    (stage-1 workers and the resolver first, the split last)."""
    every = min(0.2 / a.speed, 10.0)  # 0.2 trace s
    base = StreamSettings(
        bootstrap, app_id=f"campaign-{uuid.uuid4().hex[:6]}", partitions=PARTITIONS,
        job_idle_s=15.0 / min(a.speed, 1.0), comm_groups=a.comm_groups,
        trace_speed=a.speed, evaluate_interval_s=every,
        snapshot_interval_s=max(1.0, every),
    )  # fmt: skip
    stages = (
        ["comm"] * a.workers + ["job", "split"]
        if a.two_stage
        else ["single"] * a.workers
    )
    for stage in dict.fromkeys(stages):
        ensure_topics(replace(base, stage=stage))
    procs = []
    for i, stage in enumerate(stages):
        settings = replace(base, stage=stage, data_dir=str(work / f"faust{i}"))
        procs.append(WorkerProcess(settings, work / f"worker{i}-{stage}.log"))
        procs[-1].start(120)
    return procs


Hop = tuple[str, list[str], Callable[[str], list[int]]]
"""One consumer group on the way to the findings: (group id, topics it reads,
the partitions a job's records take there)."""


class Backlog:
    """How far the workers' consumer groups are behind on a job's partitions.

    A run is scored once the workers committed past everything its job
    published (they commit right after each snapshot), plus ``--grace``: a
    worker that lags is then late on Kafka (which the latencies show) but
    not cut off. The two-stage path has two hops: the split group past the
    job's raw records, then the stage-1 group past what the split had written
    for the job by then.
    """

    def __init__(self, bootstrap: str, hops: list[Hop]) -> None:
        from confluent_kafka import Consumer  # noqa: PLC0415

        self.hops = hops
        self.consumers = [
            Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": group,
                    "enable.auto.commit": False,
                }
            )  # fmt: skip
            for group, _, _ in hops
        ]

    def ends(self, job: str, hop: int = 0) -> list[Any]:
        """The end offsets of ``job``'s partitions on hop ``hop``'s topics now."""
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        _, topics, parts = self.hops[hop]
        consumer = self.consumers[hop]
        return [
            TopicPartition(t, p, consumer.get_watermark_offsets(
                TopicPartition(t, p), timeout=10)[1])
            for t in topics for p in parts(job)
        ]  # fmt: skip

    def caught_up(self, ends: list[Any], hop: int = 0) -> bool:
        """Whether hop ``hop``'s group committed up to ``ends``."""
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        asked = [TopicPartition(e.topic, e.partition) for e in ends]
        done = self.consumers[hop].committed(asked, timeout=10)
        return all(d.offset >= e.offset for d, e in zip(done, ends, strict=True))

    def close(self) -> None:
        """Release the clients (they never joined the groups)."""
        for c in self.consumers:
            c.close()


def _hops(
    a: argparse.Namespace, workers: list[WorkerProcess], topics: TopicSet
) -> list[Hop]:
    app = workers[0].settings.app_id
    raw = [topics.state, topics.completion]
    if not a.two_stage:
        return [(app, raw, lambda job: [partition_for(job, PARTITIONS)])]
    groups = range(a.comm_groups)
    return [
        (f"{app}-split", raw, lambda job: [partition_for(job, PARTITIONS)]),
        (f"{app}-comm", [topics.split_state],
         lambda job: sorted({group_partition(job, g, PARTITIONS) for g in groups})),
    ]  # fmt: skip


@dataclass
class Run:
    fault: str
    seed: int
    job_id: str
    truth: Path
    proc: subprocess.Popen[bytes]
    ended: float | None = None
    ends: list[Any] = field(default_factory=list)
    hop: int = 0
    caught_up: float | None = None


def _launch(fault: str, seed: int, a: argparse.Namespace, work: Path,
            bootstrap: str) -> Run:  # fmt: skip
    tp, pp, dp = SHAPES[a.ranks]
    job = f"live-{a.ranks}-{fault or 'healthy'}-{seed}"
    truth = work / f"{job}.truth.json"
    args = ["simulate", "--ranks", str(a.ranks), "--tp", str(tp), "--pp", str(pp),
            "--dp", str(dp), "--seed", str(seed), "--duration", str(a.duration),
            "--kafka", bootstrap, "--truth", str(truth), "--job-id", job,
            "--speed", str(a.speed)]  # fmt: skip
    if fault:
        args += ["--fault", fault]
    return Run(fault, seed, job, truth, _spawn(args, work / f"{job}.log"))


def _score(run: Run, collector: Collector, a: argparse.Namespace) -> dict[str, Any]:
    truth = json.loads(run.truth.read_text())
    with collector.lock:
        seen = collector.jobs.get(run.job_id, Seen())
        doc = _on_kafka(seen, truth["trace_start_s"], a.speed)
    (run.truth.parent / f"{run.job_id}.analysis.json").write_text(json.dumps(doc))
    faults = truth.get("faults") or [{}]
    return score_run(truth, doc) | {
        "kind_truth": faults[0].get("kind"),
        "seed": run.seed, "ranks": a.ranks, "duration_s": a.duration, "job": run.job_id,
    }  # fmt: skip


def _seeds_per_fault(rows: list[dict[str, Any]]) -> int:
    """Seeds of the fault with the fewest runs (appended parts included)."""
    per = Counter(r["fault"] for r in rows if r["fault"] != "healthy")
    return min(per.values(), default=0)


def campaign(a: argparse.Namespace) -> list[dict[str, Any]]:
    faults = list(FAULTS) if a.faults == "all" else a.faults.split(",")
    seeds = range(a.first_seed, a.first_seed + a.seeds)
    queue = [(f, s) for s in seeds for f in faults]
    queue += [("", 1000 + a.first_healthy + s) for s in range(a.healthy_runs)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = a.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        broker = KafkaBroker(work / "broker", heap_mb=768)
        bootstrap = broker.start()
        topics = TopicSet(partitions=PARTITIONS)
        create_topics(bootstrap, topics)
        workers = _start_workers(a, bootstrap, work)
        collector = Collector(bootstrap, topics)
        collector.start()
        backlog = Backlog(bootstrap, _hops(a, workers, topics))
        running: list[Run] = []
        try:
            while queue or running:
                while queue and len(running) < a.concurrency:
                    running.append(_launch(*queue.pop(0), a, work, bootstrap))
                time.sleep(0.5)
                now = time.monotonic()
                for run in list(running):
                    if run.ended is None and run.proc.poll() is not None:
                        run.ended, run.ends = now, backlog.ends(run.job_id)
                    if run.ended is None:
                        continue
                    if run.caught_up is None and now - run.ended > a.max_wait:
                        run.caught_up = now
                    elif run.caught_up is None and backlog.caught_up(run.ends, run.hop):
                        if run.hop + 1 < len(backlog.hops):
                            run.hop += 1
                            run.ends = backlog.ends(run.job_id, run.hop)
                        else:
                            run.caught_up = now
                    if run.caught_up is not None and now - run.caught_up > a.grace:
                        running.remove(run)
                        row = _score(run, collector, a)
                        row["catch_up_s"] = round(run.caught_up - run.ended, 1)
                        rows.append(row)
                        print(json.dumps({k: row[k] for k in (
                            "job", "detected", "detection_latency_s",
                            "rca_after_detection_s", "rank_ok", "component_ok")}),
                            flush=True)  # fmt: skip
        finally:
            backlog.close()
            collector.stopping.set()
            collector.join(10)
            for w in workers:
                w.stop(30)
            broker.close()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", type=int, choices=sorted(SHAPES), default=64)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0,
                   help="seeds --first-seed .. --first-seed + --seeds - 1 "
                   "(add seeds to a campaign with --append)")  # fmt: skip
    p.add_argument("--first-healthy", type=int, default=0,
                   help="healthy runs use seeds 1000 + this on")  # fmt: skip
    p.add_argument("--faults", default="all", help="comma-separated, or all")
    p.add_argument("--healthy-runs", type=int, default=2)
    p.add_argument("--duration", type=float, default=30.0, help="simulated s per run")
    p.add_argument("--speed", type=float, default=1.0,
                   help="trace s per wall s (below 1: slowed, see above)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=4, help="jobs at once")
    p.add_argument("--workers", type=int, default=2,
                   help="workers (stage-1 workers with --two-stage)")  # fmt: skip
    p.add_argument("--two-stage", action="store_true",
                   help="the stages of streams/SCALING.md")  # fmt: skip
    p.add_argument("--comm-groups", type=int, default=PARTITIONS,
                   help="comm groups per job with --two-stage")  # fmt: skip
    p.add_argument(
        "--workdir", type=Path, help="keep logs, truths and each job's findings here"
    )
    p.add_argument("--out", type=Path, help="results JSON (default bench/results/)")
    p.add_argument(
        "--grace",
        type=float,
        default=4.0,
        help="s to wait for findings once the workers caught up",
    )
    p.add_argument("--max-wait", type=float, default=120.0,
                   help="s to wait for the workers to catch up")  # fmt: skip
    p.add_argument("--append", action="store_true",
                   help="add these runs to --out (a run of the same fault and "
                   "seed replaces the old one) instead of replacing it")  # fmt: skip
    a = p.parse_args()
    out = a.out or RESULTS / f"campaign_live_{a.ranks}.json"
    if a.append and out.exists():
        # Checked before the hours of runs, not after them.
        measured = json.loads(out.read_text()).get("speed", 1.0)
        if measured != a.speed:
            print(f"--append: {out} was measured at --speed {measured}, "
                  f"not {a.speed}; give another --out", file=sys.stderr)  # fmt: skip
            return 2
    started, commit = time.time(), source_commit()
    rows = campaign(a)
    command = " ".join(["python bench/campaign_live.py", *sys.argv[1:]])
    wall = round(time.time() - started, 1)
    if a.append and out.exists():
        # Each part keeps the command and source commit it measured.
        old = json.loads(out.read_text())
        again = {(r["fault"], r["seed"]) for r in rows}
        rows = [r for r in old["rows"] if (r["fault"], r["seed"]) not in again] + rows
        command = f"{old.get('command', '(command not recorded)')}; {command}"
        commit = f"{old.get('commit', 'not recorded')}, {commit}"
        wall = round(old["wall_s"] + wall, 1)
    doc = {
        "command": command,
        "commit": commit,
        "ranks": a.ranks, "seeds": _seeds_per_fault(rows), "workers": a.workers,
        "two_stage": a.two_stage, "comm_groups": a.comm_groups if a.two_stage else None,
        "concurrency": a.concurrency, "speed": a.speed,
        "duration_s": fault_duration(rows, a.duration),
        "wall_s": wall,
        "per_fault": aggregate(rows), "paper": paper_comparison(rows), "rows": rows,
    }  # fmt: skip
    out.write_text(json.dumps(doc, indent=2) + "\n")
    png = out.with_name(out.stem + "_cdf.png")
    plot({"sizes": {str(a.ranks): {"runs": rows}}}, png)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
