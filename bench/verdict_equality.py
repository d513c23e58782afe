"""Live verdicts equal offline ones, whatever the worker's speed or crashes.

For every fault type x seed (and healthy runs) a 64-rank job is simulated
once per *mode*, with its own job id (the same seed gives the same records),
analyzed offline by ``mycroft analyze``'s code path (``Replay``), and
published into a real broker where one real ``mycroft streams worker`` reads
it. A mode is how the records reach the worker:

* ``speed1``, ``speed4``, ``fast``: ``mycroft replay --speed 1 | 4 | 0``
  (``0``: as fast as the broker takes them);
* ``outage``: ``mycroft agent --source replay --replay-speed 1``, while the
  broker is stopped for ``--outage-s`` every ``--outage-every-s``: the agents
  spool to disk and replay when it returns;
* ``kill``: ``mycroft replay --speed 1`` while the worker is killed with
  SIGKILL every ``--kill-every-s`` and restarted (it resumes from its
  changelog snapshots and committed offsets);
* ``stop``: the same with SIGTERM, a graceful stop (what a rolling deploy
  or a rebalance that moves the worker's partitions does).

A mode's jobs run ``--concurrency`` at a time on one worker. Each live job's
root causes (the latest revision of each incident: incident id, kind, and
every culprit's rank, component and kind) are compared with the offline
ones; ``equal`` is both the same, ``same_culprits`` the same best culprit of
each incident in onset order (ids aside). No truth is read by either side:
the simulator's truth only scores the offline verdict (``rank_ok``).

``--setting NAME`` simulates one of ``bench/campaign_general.py``'s settings
(1F1B, tree all-reduce, slot counters, other layouts; seeds offset by its
``seed_base``) in place of the default 64-rank job. Usage::

    python bench/verdict_equality.py --seeds 3 --healthy-runs 2
    python bench/verdict_equality.py --seeds 1 --faults nic-down,gpu-hang --modes fast
    python bench/verdict_equality.py --setting 1f1b-2x4x4-h4-slots --seeds 1 \
        --first-seed 1 --faults net-background-traffic --healthy-runs 0

Results: ``bench/results/verdict_equality.json``.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign.score import score_run  # noqa: E402
from bench.campaign_general import SETTINGS, Setting  # noqa: E402
from bench.campaign_live import Backlog, Collector, Seen  # noqa: E402
from bench.campaign_offline import SHAPES, source_commit  # noqa: E402
from mycroft.infra.kafka_broker import KafkaBroker  # noqa: E402
from mycroft.kafka_client import create_topics  # noqa: E402
from mycroft.producers.sim.config import SimConfig  # noqa: E402
from mycroft.producers.sim.engine import simulate  # noqa: E402
from mycroft.producers.sim.faults import FAULTS, parse_spec  # noqa: E402
from mycroft.producers.tracefile import ListWriter, TraceFileWriter  # noqa: E402
from mycroft.schemas.records import RootCause  # noqa: E402
from mycroft.streams.analyze import Replay, to_json  # noqa: E402
from mycroft.streams.faust_settings import StreamSettings  # noqa: E402
from mycroft.streams.faust_topics import ensure_topics  # noqa: E402
from mycroft.streams.worker_process import WorkerProcess  # noqa: E402
from mycroft.topics import TopicSet, partition_for  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 8
MODES = ("speed1", "speed4", "fast", "outage", "kill", "stop")

Verdict = list[tuple[str, str, list[tuple[int, str, str]]]]


def verdict(causes: dict[str, RootCause]) -> Verdict:
    """Each incident's latest revision in onset order: id, kind, culprits."""
    return [
        (
            rc.incident_id,
            rc.kind.value,
            [(c.rank, c.component.value, c.kind.value) for c in rc.culprits],
        )
        for rc in sorted(causes.values(), key=lambda c: (c.onset_ns, c.incident_id))
    ]


def best(v: Verdict) -> list[tuple[str, tuple[int, str, str] | None]]:
    """Each incident's kind and best culprit, ids aside."""
    return [(kind, culprits[0] if culprits else None) for _, kind, culprits in v]


def make_job(  # noqa: PLR0913, PLR0917 - one run's inputs
    fault: str,
    seed: int,
    job: str,
    duration: float,
    work: Path,
    setting: Setting | None = None,
) -> tuple[Path, Verdict, dict[str, Any]]:
    """Simulate one job to a trace file (the default 64-rank job, or
    ``setting``'s); return it, the offline verdict and the offline verdict's
    score against the truth (read only for that)."""
    if setting is not None:
        cfg = setting.config(seed, duration, job)
    else:
        tp, pp, dp = SHAPES[64]
        cfg = SimConfig(tp=tp, pp=pp, dp=dp, duration_s=duration, seed=seed, job_id=job)
    out = ListWriter()
    result = simulate(cfg, [parse_spec(fault)] if fault else [], out)
    path = work / f"{job}.trace"
    with TraceFileWriter(path) as w:
        for ts, rec in out.records:
            w.write(rec, ts)
    rp = Replay()
    for ts, rec in out.records:
        rp.feed(ts, rec)
    anomalies, causes = rp.finish()
    scored = score_run(result.truth(), to_json(anomalies, causes))
    return path, verdict(causes), scored


def _mycroft(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mycroft", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def publisher(mode: str, trace: Path, bootstrap: str, work: Path, job: str) -> Any:
    """Start what publishes ``trace`` in ``mode``."""
    log = work / f"{job}.publish.log"
    if mode == "outage":
        return _mycroft(
            ["agent", "--source", "replay", "--replay-file", str(trace),
             "--replay-speed", "1", "--job-id", job, "--host", job,
             "--bootstrap", bootstrap, "--spool-dir", str(work / f"{job}.spool"),
             "--delivery-timeout-ms", "3000", "--retry-s", "0.5",
             "--spool-fsync-s", "0", "--metrics-port", "0"],
            log,
        )  # fmt: skip
    speed = {"speed4": "4", "fast": "0"}.get(mode, "1")
    return _mycroft(["replay", str(trace), "--kafka", bootstrap, "--speed", speed], log)


class Disturber(threading.Thread):
    """Stops the broker (``outage``), kills the worker (``kill``) or stops it
    (``stop``) on a period."""

    def __init__(
        self, mode: str, broker: KafkaBroker, worker: WorkerProcess, a: Any
    ) -> None:
        super().__init__(daemon=True)
        self.mode, self.broker, self.worker, self.a = mode, broker, worker, a
        self.stopping = threading.Event()
        self.events = 0

    def run(self) -> None:
        every = self.a.outage_every_s if self.mode == "outage" else self.a.kill_every_s
        while not self.stopping.wait(every):
            if self.mode == "outage":
                self.broker.stop()
                time.sleep(self.a.outage_s)
                self.broker.start()
            else:
                if self.mode == "stop":
                    self.worker.stop()
                else:
                    self.worker.kill()
                self.worker.start(120)
            self.events += 1


def _retry(fn: Any, *args: Any) -> Any:
    """Call a Kafka admin read until the broker answers (it may be in an
    outage of the ``outage`` mode)."""
    from confluent_kafka import KafkaException  # noqa: PLC0415

    for _ in range(60):
        try:
            return fn(*args)
        except KafkaException:
            time.sleep(1.0)
    return fn(*args)


def _agent_done(proc: Any, duration: float, started: float) -> bool:
    """An agent replaying a file runs until stopped: stop it once the file is
    out (its duration, plus time for its spool to drain)."""
    if time.monotonic() - started < duration + 15:
        return False
    proc.terminate()
    proc.wait(60)
    return True


def run_mode(
    mode: str, jobs: list[dict[str, Any]], a: Any, work: Path
) -> list[dict[str, Any]]:
    """Publish ``mode``'s jobs on a fresh broker and worker; compare verdicts."""
    broker = KafkaBroker(work / f"broker-{mode}", heap_mb=768)
    bootstrap = broker.start()
    topics = TopicSet(partitions=PARTITIONS)
    create_topics(bootstrap, topics)
    settings = StreamSettings(
        bootstrap,
        app_id=f"eq-{mode}-{uuid.uuid4().hex[:6]}",
        partitions=PARTITIONS,
        job_idle_s=600.0,
        data_dir=str(work / f"faust-{mode}"),
    )
    ensure_topics(settings)
    worker = WorkerProcess(settings, work / f"worker-{mode}.log")
    worker.start(120)
    collector = Collector(bootstrap, topics)
    collector.start()
    backlog = Backlog(
        bootstrap,
        [
            (
                settings.app_id,
                [topics.state, topics.completion, topics.heartbeat],
                lambda job: [partition_for(job, PARTITIONS)],
            )
        ],
    )
    disturber = Disturber(mode, broker, worker, a)
    if mode in ("outage", "kill", "stop"):
        disturber.start()
    rows: list[dict[str, Any]] = []
    queue, running = list(jobs), []
    try:
        while queue or running:
            while queue and len(running) < a.concurrency:
                job = queue.pop(0)
                job["proc"] = publisher(mode, job["trace"], bootstrap, work, job["job"])
                job["started"], job["ended"] = time.monotonic(), None
                running.append(job)
            time.sleep(0.5)
            for job in list(running):
                proc, now = job["proc"], time.monotonic()
                if job["ended"] is None:
                    done = (
                        _agent_done(proc, a.duration, job["started"])
                        if mode == "outage"
                        else proc.poll() is not None
                    )
                    if done:
                        job["ended"], job["ends"] = (
                            now,
                            _retry(backlog.ends, job["job"]),
                        )
                    continue
                caught = _retry(backlog.caught_up, job["ends"])
                if not caught and now - job["ended"] < a.max_wait:
                    continue
                if "caught" not in job:
                    job["caught"] = now
                if now - job["caught"] < a.grace:
                    continue
                running.remove(job)
                rows.append(_compare(mode, job, collector, caught))
                print(json.dumps({k: rows[-1][k] for k in (
                    "mode", "job", "equal", "same_culprits")}), flush=True)  # fmt: skip
    finally:
        disturber.stopping.set()
        if disturber.is_alive():
            disturber.join(180)
        backlog.close()
        collector.stopping.set()
        collector.join(10)
        worker.stop(30)
        broker.close()
    for r in rows:
        r["disturbances"] = disturber.events
    return rows


def _compare(
    mode: str, job: dict[str, Any], collector: Collector, caught: bool
) -> dict[str, Any]:
    with collector.lock:
        seen = collector.jobs.get(job["job"], Seen())
        live = verdict(dict(seen.causes))
    offline = job["offline"]
    return {
        "mode": mode,
        "job": job["job"],
        "fault": job["fault"] or "healthy",
        "seed": job["seed"],
        "equal": live == offline,
        "same_culprits": best(live) == best(offline),
        "caught_up": caught,
        "live_incidents": len(live),
        "offline_incidents": len(offline),
        "live": best(live),
        "offline": best(offline),
        "live_full": live if live != offline else None,
        "offline_full": offline if live != offline else None,
        "offline_rank_ok": job["scored"].get("rank_ok"),
        "false_root_causes_live": len(live) if not job["fault"] else None,
    }


@contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: runs, equal, same best culprits, false root causes."""
    out: dict[str, Any] = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        rs = [r for r in rows if r["mode"] == mode]
        healthy = [r for r in rs if r["fault"] == "healthy"]
        out[mode] = {
            "runs": len(rs),
            "equal": sum(r["equal"] for r in rs),
            "same_culprits": sum(r["same_culprits"] for r in rs),
            "healthy_runs": len(healthy),
            "false_root_causes_live": sum(r["live_incidents"] for r in healthy),
            "disturbances": rs[0]["disturbances"] if rs else 0,
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--faults", default="all", help="comma-separated, or all")
    p.add_argument("--healthy-runs", type=int, default=2)
    p.add_argument("--duration", type=float, default=20.0, help="simulated s per run")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--outage-s", type=float, default=5.0)
    p.add_argument("--outage-every-s", type=float, default=20.0)
    p.add_argument("--kill-every-s", type=float, default=15.0)
    p.add_argument("--grace", type=float, default=6.0,
                   help="s to wait for findings once the worker caught up")  # fmt: skip
    p.add_argument("--max-wait", type=float, default=180.0)
    p.add_argument("--workdir", type=Path)
    p.add_argument("--out", type=Path, default=RESULTS / "verdict_equality.json")
    p.add_argument(
        "--setting",
        choices=[s.name for s in SETTINGS],
        help="simulate this bench/campaign_general.py setting, not the 64-rank job",
    )
    a = p.parse_args()
    setting = next((s for s in SETTINGS if s.name == a.setting), None)
    faults = list(FAULTS) if a.faults == "all" else a.faults.split(",")
    seeds = range(a.first_seed, a.first_seed + a.seeds)
    runs = [(f, s) for f in faults for s in seeds]
    runs += [("", 1000 + s) for s in range(a.healthy_runs)]
    started, commit = time.time(), source_commit()
    rows: list[dict[str, Any]] = []
    with _workdir(a.workdir) as work:
        for mode in a.modes.split(","):
            jobs = []
            for fault, seed in runs:
                job = f"eq-{mode}-{fault or 'healthy'}-{seed}"
                trace, offline, scored = make_job(
                    fault, seed, job, a.duration, work, setting
                )
                jobs.append(
                    {"job": job, "fault": fault, "seed": seed, "trace": trace,
                     "offline": offline, "scored": scored}
                )  # fmt: skip
            rows += run_mode(mode, jobs, a, work)
    doc = {
        "command": " ".join(["python bench/verdict_equality.py", *sys.argv[1:]]),
        "commit": commit,
        "setting": a.setting or "default",
        "ranks": setting.tp * setting.pp * setting.dp if setting else 64,
        "duration_s": a.duration,
        "concurrency": a.concurrency,
        "wall_s": round(time.time() - started, 1),
        "summary": summary(rows),
        "rows": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
