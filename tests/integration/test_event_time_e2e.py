"""Live verdicts equal ``mycroft analyze``'s, whatever order the worker reads.

Simulated jobs are published to a real broker topic by topic in orders a
worker never sees offline (every heartbeat first, or every state batch
before any completion), read by a real worker that is killed with SIGKILL
mid-incident and restarted; each job's root causes (incident ids, culprits)
must be exactly those of the offline analysis of the same records, down to
when an incident whose fault cleared closes (its closed revision's event time).
``bench/verdict_equality.py`` measures the same over every fault type at
three replay speeds, broker outages and repeated kills.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mycroft.kafka_client import RecordPublisher
from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import Record, RootCause
from mycroft.streams.analyze import Replay
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.faust_topics import ensure_topics
from mycroft.streams.worker_process import WorkerProcess
from mycroft.topics import TopicSet
from tests.integration.test_streams_e2e import Outputs

pytestmark = pytest.mark.integration

Verdict = list[tuple[str, list[tuple[int, str, str]], str, int | None]]
BEATS_FIRST = ("Heartbeat", "Topology", "CompletionBatch", "StateBatch")
STATES_FIRST = ("Topology", "StateBatch", "CompletionBatch", "Heartbeat")
ORDERS = {  # job -> (fault, topic order it is published in)
    "et-nic": ("nic-down:at=5", BEATS_FIRST),
    "et-gpu": ("gpu-hang:rank=5,at=5", STATES_FIRST),
    "et-ok": ("", None),
    "et-clear": ("nic-bandwidth:at=3,duration=2", None),  # clears: it closes
}


def _records(job: str, fault: str) -> list[tuple[int, Record]]:
    cfg = SimConfig(tp=4, pp=2, dp=2, duration_s=12.0, seed=2, job_id=job)
    out = ListWriter()
    simulate(cfg, [parse_spec(fault)] if fault else [], out)
    return out.records


def _verdict(causes: list[RootCause]) -> Verdict:
    latest: dict[str, RootCause] = {}
    for rc in causes:
        if (
            rc.incident_id not in latest
            or rc.revision >= latest[rc.incident_id].revision
        ):
            latest[rc.incident_id] = rc
    ordered = sorted(latest.values(), key=lambda r: (r.onset_ns, r.incident_id))
    return [
        (
            rc.incident_id,
            [(c.rank, c.component.value, c.kind.value) for c in rc.culprits],
            rc.state.value,
            rc.closed_ns,
        )
        for rc in ordered
    ]


def _offline(records: list[tuple[int, Record]]) -> Verdict:
    rp = Replay()
    for ts, rec in records:
        rp.feed(ts, rec)
    _, causes = rp.finish()
    return _verdict(list(causes.values()))


def _publish(
    s: StreamSettings,
    records: list[tuple[int, Record]],
    order: tuple[str, ...] | None,
) -> None:
    pub = RecordPublisher(s.bootstrap, TopicSet(s.prefix, s.partitions))
    recs = [r for _, r in records]
    if order is not None:
        recs.sort(
            key=lambda r: order.index(type(r).__name__)
        )  # stable: per topic in order
    for rec in recs:
        pub.publish(rec)
    assert pub.flush(30) == 0 and pub.stats.failed == 0


def _difference(
    jobs: dict[str, list[tuple[int, Record]]],
    live: Callable[[str], Verdict],
    offline: dict[str, Verdict],
    worker: WorkerProcess,
) -> str:
    """The jobs whose live verdict differs, both verdicts in full, the log's tail."""
    lines = []
    for job in jobs:
        if live(job) != offline[job]:
            lines += [f"{job} live:    {live(job)}", f"{job} offline: {offline[job]}"]
    return "\n".join([*lines, worker.log()[-3000:]])


def test_live_verdicts_equal_offline_across_read_orders_and_a_kill(
    kafka_bootstrap: str, unique_name: Callable[..., str], tmp_path: Path
) -> None:
    app_id = unique_name("event-time")
    s = StreamSettings(
        kafka_bootstrap, app_id=app_id, prefix=f"{app_id}.", partitions=2,
        evaluate_interval_s=0.1, snapshot_interval_s=0.5,
        data_dir=str(tmp_path / "data"), job_idle_s=600.0,
    )  # fmt: skip
    ensure_topics(s)
    jobs = {job: _records(job, fault) for job, (fault, _) in ORDERS.items()}
    offline = {job: _offline(recs) for job, recs in jobs.items()}
    assert offline["et-nic"] and offline["et-gpu"] and offline["et-ok"] == []
    assert [v[2] for v in offline["et-clear"]] == ["closed"]
    out = Outputs(s)
    worker = WorkerProcess(s, tmp_path / "worker.log")
    worker.start(120)
    try:
        for job, (_, order) in ORDERS.items():
            _publish(s, jobs[job], order)
        out.wait_for(bool, 120)
        worker.kill()  # mid-incident: the other job may still be in flight
        worker.start(120)

        def live(job: str) -> Verdict:
            return _verdict([r for r in out.root_causes() if r.job_id == job])

        deadline = time.monotonic() + 120
        while any(live(j) != offline[j] for j in ("et-nic", "et-gpu", "et-clear")):
            assert time.monotonic() < deadline, _difference(jobs, live, offline, worker)
            out.poll(0.5)
        out.poll(5.0)  # anything later would be a difference too
        assert {j: live(j) for j in jobs} == offline
    finally:
        out.close()
        worker.stop()
