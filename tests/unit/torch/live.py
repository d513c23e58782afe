"""Live-pipeline plumbing of the torch integration tests (not a test module).

A real ``mycroft streams worker`` per test module, a real ``mycroft agent``
per scenario (its ``--job-id`` is the scenario's), 4 real gloo ranks traced
through the opt-in hook, and a reader of the root-cause topic.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from mycroft.producers.tracefile import TraceFileWriter
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Record, RootCause
from mycroft.streams.analyze import Replay
from mycroft.streams.faust_runtime import record_job, record_time_ns
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.faust_topics import ensure_topics
from mycroft.topics import TopicSet
from tests.agent_process import stop_agent
from tests.integration.test_streams_e2e import WorkerProc
from tests.unit.torch import harness


def worker(bootstrap: str, tmp: Path) -> Iterator[StreamSettings]:
    """Run one worker on fresh topics for a module (generator fixture body)."""
    app_id = f"torch-live-{time.time_ns() % 10**10}"
    s = StreamSettings(
        bootstrap,
        app_id=app_id,
        prefix=f"{app_id}.",
        partitions=1,
        evaluate_interval_s=0.2,
        snapshot_interval_s=1.0,
        data_dir=str(tmp / "data"),
    )
    ensure_topics(s)
    w = WorkerProc(s, tmp / "worker.log")
    w.start(60)
    try:
        yield s
    finally:
        w.stop()


def start_agent(s: StreamSettings, job_id: str, tmp: Path) -> subprocess.Popen[bytes]:
    """``mycroft agent`` reading ``tmp/rings`` for ``job_id``."""
    with open(tmp / "agent.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mycroft",
                "agent",
                "--job-id",
                job_id,
                "--host",
                "node0",
                "--ring-dir",
                str(tmp / "rings"),
                "--spool-dir",
                str(tmp / "spool"),
                "--bootstrap",
                s.bootstrap,
                "--topic-prefix",
                s.prefix,
                "--partitions",
                "1",
                "--interval-ms",
                "100",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def root_cause_poller(s: StreamSettings) -> Callable[[], list[RootCause]]:
    """A poller of the root-cause topic from its beginning."""
    consumer = Consumer({"bootstrap.servers": s.bootstrap, "group.id": "unused"})
    consumer.assign([TopicPartition(TopicSet(s.prefix, 1).rootcause, 0, 0)])
    codec, got = Codec(), []

    def poll() -> list[RootCause]:
        for msg in consumer.consume(100, 0.3):
            if msg.error() is None:
                rec = codec.decode(msg.value() or b"")
                if isinstance(rec, RootCause):
                    got.append(rec)
        return got

    return poll


def record_trace(s: StreamSettings, job_id: str, path: Path) -> list[RootCause]:
    """Write ``job_id``'s input records, read back from the broker, to the
    trace file ``path`` in event-time order; return the root causes the
    offline analyzer finds in it (``mycroft analyze path`` replays it).

    A live verdict that the offline one does not repeat came from how the
    worker read the records, not from the records."""
    topics = TopicSet(s.prefix, 1)
    names = [topics.topology, topics.state, topics.completion, topics.heartbeat]
    consumer = Consumer({"bootstrap.servers": s.bootstrap, "group.id": "unused"})
    codec, got = Codec(), list[tuple[int, Record]]()
    try:
        for name in names:
            tp = TopicPartition(name, 0, 0)
            end = consumer.get_watermark_offsets(tp, timeout=10)[1]
            consumer.assign([tp])
            at = 0
            while at < end:
                batch = consumer.consume(500, 2.0)
                if not batch:
                    break  # nothing more to read
                for msg in batch:
                    at = max(at, msg.offset() + 1)
                    if msg.error() is not None:
                        continue
                    rec = codec.decode(msg.value() or b"")
                    if record_job(rec) == job_id:
                        got.append((record_time_ns(rec), rec))
    finally:
        consumer.close()
    got.sort(key=lambda tr: tr[0])
    replay = Replay()
    with TraceFileWriter(path) as w:
        for ts, rec in got:
            w.write(rec, ts)
            replay.feed(ts, rec)
    return list(replay.finish()[1].values())


def named(rc: RootCause, rank: int, kind: str) -> bool:
    """Whether ``rc``'s best culprit is ``rank`` with fault kind ``kind``."""
    best = rc.culprits[0] if rc.culprits else None
    return best is not None and (best.rank, best.kind.value) == (rank, kind)


def run_live(
    s: StreamSettings, scenario: str, tmp: Path, timeout_s: float = 45.0
) -> list[RootCause]:
    """Run ``scenario`` until its culprit is named (or ``timeout_s``); return RCs."""
    job_id = f"torch-{scenario}-{time.time_ns() % 10**9}"
    (tmp / "rings").mkdir()
    rank, _comp, kind = harness.EXPECTED[scenario]
    poll = root_cause_poller(s)
    agent = start_agent(s, job_id, tmp)
    found: list[RootCause] = []
    try:
        env = harness.traced_env(tmp / "rings")
        with harness.run_ranks(harness.SCENARIO_ARGS[scenario], env, tmp / "logs"):
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                found = [r for r in poll() if r.job_id == job_id]
                if any(named(r, rank, kind) for r in found):
                    break
    finally:
        stop_agent(agent, tmp / "agent.log")
    return found


def summary(
    found: list[RootCause],
) -> list[tuple[str, list[tuple[int, str, float, tuple[str, ...]]]]]:
    """Root causes in short (culprits with the rules that named them), for
    assertion messages."""
    return [
        (
            r.kind.value,
            [
                (c.rank, c.component.value, c.confidence, tuple(c.rules))
                for c in r.culprits
            ],
        )
        for r in found
    ]


Launch = Callable[
    [Sequence[str], int, Mapping[str, str], Path], list[subprocess.Popen[bytes]]
]
"""``launch(job args, world, env, log dir)`` of a job script (``ddp_job`` ...)."""


def run_job_live(  # noqa: PLR0913 - the job, its fault and where to run it
    s: StreamSettings,
    launch: Launch,
    job_args: Sequence[str],
    want: tuple[int, str],
    timeout_s: float,
    tmp: Path,
) -> list[RootCause]:
    """Run 4 traced ranks of a job until a root cause names ``want`` (rank,
    fault kind) or ``timeout_s`` passed; return the job's root causes."""
    job_id = f"torch-{time.time_ns() % 10**12}"
    (tmp / "rings").mkdir()
    poll = root_cause_poller(s)
    agent = start_agent(s, job_id, tmp)
    found: list[RootCause] = []
    procs = launch(job_args, 4, harness.traced_env(tmp / "rings"), tmp / "logs")
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [r for r in poll() if r.job_id == job_id]
            if any(named(r, *want) for r in found):
                break
    finally:
        harness.job().stop(procs)
        stop_agent(agent, tmp / "agent.log")
    return found


def run_for(  # noqa: PLR0917 - the job, what runs it, and for how long
    s: StreamSettings,
    job_id: str,
    launch: Launch,
    job_args: Sequence[str],
    run_s: float,
    tmp: Path,
) -> list[RootCause]:
    """Run 4 traced ranks of ``launch(job_args)`` as ``job_id`` for ``run_s``
    under a node agent; return the job's live root causes.

    Fails if a rank exits meanwhile (give the job more steps than fit).
    """
    (tmp / "rings").mkdir()
    poll = root_cause_poller(s)
    agent = start_agent(s, job_id, tmp)
    env = harness.traced_env(tmp / "rings")
    procs = launch(list(job_args), 4, env, tmp / "logs")
    found: list[RootCause] = []
    try:
        deadline = time.monotonic() + run_s
        while time.monotonic() < deadline:
            found = [r for r in poll() if r.job_id == job_id]
            assert all(p.poll() is None for p in procs), harness.logs(tmp / "logs")
    finally:
        stop_agent(agent, tmp / "agent.log")  # first: the stop is no fault
        harness.job().stop(procs)
    return found


def run_healthy(
    s: StreamSettings, launch: Launch, run_s: float, tmp: Path
) -> tuple[list[RootCause], str]:
    """Run 4 traced healthy ranks of a job for ``run_s``; return its root
    causes, and when there are any, where its records were written and
    what the offline analyzer finds in them (:func:`record_trace`).

    Fails if a rank exits meanwhile (the job runs far more steps than fit).
    """
    job_id = f"torch-none-{time.time_ns() % 10**12}"
    found = run_for(s, job_id, launch, ["--iters", "1000000"], run_s, tmp)
    if not found:
        return found, ""
    trace = tmp / "job.trace"
    offline = record_trace(s, job_id, trace)
    return found, f"records in {trace}; offline: {summary(offline)}"
