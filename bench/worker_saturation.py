"""How many live 64-rank jobs one stream worker carries, and what overload does.

Every job is a simulated 64-rank job written to a trace file, analyzed
offline (``mycroft analyze``'s code path), and replayed live at its recorded
pace (``mycroft replay --speed 1``) into a real broker, read by real
``mycroft streams worker`` processes of one consumer group.

1. **Ramp**: ``--ramp`` healthy jobs at once, more each step; the worker's
   record lag (the stats line's ``max_lag_s``: processing time minus the
   record's broker time, worst per 2 s) over each step's second half. The
   saturation point is the largest step whose worst lag stays under
   ``--lag-limit-s``.
2. **Overload**: twice that many jobs, one in four with a fault: the lag
   grows, and every job's live root causes must still equal the offline ones
   (no false root cause on a healthy job); how long the worker takes to catch
   up once the jobs end.
3. **Two workers**: the same load on two workers with one app id: the jobs
   each one holds (its stats line's ``jobs``) and the worst lag.

Usage::

    python bench/worker_saturation.py
    python bench/worker_saturation.py --ramp 2,4,6 --duration 30

Results: ``bench/results/worker_saturation.json``. Measure it on a quiet
machine: the jobs' replays and the broker share its cores with the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign_live import Collector, Seen  # noqa: E402
from bench.campaign_offline import source_commit  # noqa: E402
from bench.verdict_equality import best, make_job, publisher, verdict  # noqa: E402
from mycroft.infra.kafka_broker import KafkaBroker  # noqa: E402
from mycroft.kafka_client import create_topics  # noqa: E402
from mycroft.producers.sim.faults import FAULTS  # noqa: E402
from mycroft.streams.faust_settings import StreamSettings  # noqa: E402
from mycroft.streams.faust_topics import ensure_topics  # noqa: E402
from mycroft.streams.worker_process import WorkerProcess  # noqa: E402
from mycroft.topics import TopicSet  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 8
_STATS = re.compile(r"stats rows_per_s=(\d+) max_lag_s=([\d.]+).*? jobs=(\d+)")
_EVENT = re.compile(r"stats .*?max_event_s=([\d.]+)")


def stats(worker: WorkerProcess, start: int) -> list[tuple[float, int]]:
    """(worst lag s, jobs held) of each stats line logged after byte ``start``."""
    return [(float(m[2]), int(m[3])) for m in _STATS.finditer(worker.log(start))]


def event_blocks(worker: WorkerProcess, start: int) -> list[float]:
    """The longest source event of each stats interval after byte ``start``."""
    return [float(m[1]) for m in _EVENT.finditer(worker.log(start))]


class Bench:
    """A broker, a collector of findings, and the workers of one app id."""

    def __init__(self, work: Path, a: argparse.Namespace) -> None:
        self.work, self.a = work, a
        self.broker = KafkaBroker(work / "broker", heap_mb=1024)
        self.bootstrap = self.broker.start()
        topics = TopicSet(partitions=PARTITIONS)
        create_topics(self.bootstrap, topics)
        self.settings = StreamSettings(
            self.bootstrap,
            app_id=f"sat-{uuid.uuid4().hex[:6]}",
            partitions=PARTITIONS,
            job_idle_s=30.0,
            stats_interval_s=2.0,
        )
        ensure_topics(self.settings)
        self.workers: list[WorkerProcess] = []
        self.collector = Collector(self.bootstrap, topics)
        self.collector.start()
        self.made = 0

    def add_worker(self) -> WorkerProcess:
        """Start one more worker of the app id (it takes its partitions)."""
        i = len(self.workers)
        settings = replace(self.settings, data_dir=str(self.work / f"faust{i}"))
        w = WorkerProcess(settings, self.work / f"worker{i}.log")
        w.start(180)
        self.workers.append(w)
        return w

    def jobs(self, n: int, faulty_every: int = 0) -> list[dict[str, Any]]:
        """``n`` new traces (every ``faulty_every``-th with a fault)."""
        out = []
        faults = list(FAULTS)
        for i in range(n):
            self.made += 1
            fault = ""
            if faulty_every and i % faulty_every == faulty_every - 1:
                fault = faults[self.made % len(faults)]
            job = f"sat-{self.made}-{fault or 'healthy'}"
            trace, offline, _ = make_job(
                fault, self.made, job, self.a.duration, self.work
            )
            out.append({"job": job, "fault": fault, "trace": trace, "offline": offline})
        return out

    def run(self, jobs: list[dict[str, Any]]) -> dict[str, Any]:
        """Replay ``jobs`` at once at their pace; lag per worker; catch-up time."""
        marks = [w.log_path.stat().st_size for w in self.workers]
        procs = [
            publisher("speed1", j["trace"], self.bootstrap, self.work, j["job"])
            for j in jobs
        ]
        for p in procs:
            p.wait()
        ended = time.monotonic()
        half = [len(w.log(m)) for w, m in zip(self.workers, marks, strict=True)]
        # Caught up: a stats line with a small lag on every worker.
        caught_up_s = None
        while time.monotonic() - ended < self.a.max_wait:
            time.sleep(2.0)
            recent = [
                stats(w, m + h)
                for w, m, h in zip(self.workers, marks, half, strict=True)
            ]
            if all(r and r[-1][0] < self.a.lag_limit_s for r in recent):
                caught_up_s = round(time.monotonic() - ended, 1)
                break
        time.sleep(self.a.grace)
        per = []
        for w, m in zip(self.workers, marks, strict=True):
            s = stats(w, m)
            second_half = s[len(s) // 4 :] or s
            blocks = sorted(event_blocks(w, m))
            per.append(
                {
                    "longest_event_s": blocks[-1] if blocks else None,
                    "longest_event_p99_of_intervals_s": (
                        blocks[min(len(blocks) - 1, int(0.99 * len(blocks)))]
                        if blocks
                        else None
                    ),
                    "worst_lag_s": max((x for x, _ in s), default=None),
                    "worst_lag_second_half_s": max(
                        (x for x, _ in second_half), default=None
                    ),
                    "jobs_held_max": max((j for _, j in s), default=0),
                }
            )
        rows = []
        for j in jobs:
            with self.collector.lock:
                seen = self.collector.jobs.get(j["job"], Seen())
                live = verdict(dict(seen.causes))
            rows.append(
                {
                    "job": j["job"],
                    "fault": j["fault"] or "healthy",
                    "equal": live == j["offline"],
                    "live": best(live),
                    "offline": best(j["offline"]),
                }
            )
        healthy = [r for r in rows if r["fault"] == "healthy"]
        return {
            "jobs": len(jobs),
            "workers": per,
            "caught_up_after_s": caught_up_s,
            "equal": sum(r["equal"] for r in rows),
            "false_root_causes": sum(len(r["live"]) for r in healthy),
            "rows": rows,
        }

    def close(self) -> None:
        """Stop everything started."""
        self.collector.stopping.set()
        self.collector.join(10)
        for w in self.workers:
            w.stop(30)
        self.broker.close()


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ramp", default="2,4,6,8,10,12", help="jobs at once per step")
    p.add_argument("--duration", type=float, default=40.0, help="simulated s per job")
    p.add_argument("--lag-limit-s", type=float, default=1.0)
    p.add_argument("--grace", type=float, default=8.0)
    p.add_argument("--max-wait", type=float, default=300.0)
    p.add_argument("--workdir", type=Path)
    p.add_argument("--out", type=Path, default=RESULTS / "worker_saturation.json")
    a = p.parse_args()
    started, commit = time.time(), source_commit()
    work = a.workdir or Path(f"/tmp/mycroft-saturation-{uuid.uuid4().hex[:6]}")
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work, a)
    doc: dict[str, Any] = {
        "command": " ".join(["python bench/worker_saturation.py", *sys.argv[1:]]),
        "commit": commit,
        "ranks": 64,
        "duration_s": a.duration,
        "lag_limit_s": a.lag_limit_s,
        # what else ran: this bench's replays, broker and workers add ~2
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
    }
    try:
        bench.add_worker()
        ramp, saturation = [], 0
        for n in (int(x) for x in a.ramp.split(",")):
            step = bench.run(bench.jobs(n))
            ramp.append(step)
            print(json.dumps({k: step[k] for k in ("jobs", "workers", "equal")}))
            if (step["workers"][0]["worst_lag_second_half_s"] or 0) >= a.lag_limit_s:
                break
            saturation = n
        doc["ramp"] = ramp
        doc["saturation_jobs"] = saturation
        load = 2 * max(saturation, 1)
        doc["overload"] = bench.run(bench.jobs(load, faulty_every=4))
        print(json.dumps({k: doc["overload"][k] for k in ("jobs", "workers", "equal")}))
        bench.add_worker()
        time.sleep(15)  # the group rebalances
        doc["two_workers"] = bench.run(bench.jobs(load, faulty_every=4))
        print(json.dumps({k: doc["two_workers"][k] for k in ("jobs", "workers")}))
    finally:
        bench.close()
    doc["wall_s"] = round(time.time() - started, 1)
    doc["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
