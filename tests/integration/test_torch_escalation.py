"""A real gloo job (4 ranks) whose rank 3 crashes: the peers are torn down.

Rank 3 ends with ``os._exit(1)`` in backward; gloo fails the peers' next
collective (the dead rank's sockets close, or the process group's 5 s
timeout runs out) and each peer exits, as an elastic agent's teardown ends
them. An in-process node agent (its ring source and aggregator) samples the
rings every 100 ms while it happens; what it ships is taken at its transport
boundary and analyzed offline (``mycroft analyze`` replays the same way).
Kafka is not what this test is about: the live torch tests run the same
agent against a real broker. The crashed rank stays the culprit; no peer
the teardown took is named, by another incident or by a revision.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mycroft.producers.agent.daemon import Agent
from mycroft.producers.agent.shipper import Shipper
from mycroft.producers.agent.sources import RingSource
from mycroft.producers.agent.spool import Spool
from mycroft.producers.tracefile import TraceFileWriter
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Record, RootCause
from mycroft.streams.analyze import Replay
from mycroft.streams.faust_runtime import record_time_ns
from mycroft.topics import TopicSet
from tests.unit.agent.test_spool_shipper import FakeTransport
from tests.unit.torch import harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CULPRIT = 3
JOB_ARGS = [
    *harness.SCENARIO_ARGS["crash"],
    "--on-error",
    "exit",
    "--pg-timeout-s",
    "5",
]
AFTER_S = 4.0  # records sampled after the last rank ended
LIMIT_S = 75.0


def _sample(rings: Path, spool: Path, procs: list[object]) -> list[tuple[int, Record]]:
    """Tick a node agent over ``rings`` every 100 ms until every rank ended
    and ``AFTER_S`` more passed; return its records in event-time order."""
    transport = FakeTransport()
    agent = Agent(
        job_id="torch-escalation",
        host="h",
        source=RingSource(rings),
        shipper=Shipper(Spool(spool), transport),
        topics=TopicSet("t."),
    )
    deadline, ended = time.monotonic() + LIMIT_S, 0.0
    while time.monotonic() < deadline:
        agent.tick()
        agent.shipper.pump()
        if not ended and all(p.poll() is not None for p in procs):  # type: ignore[attr-defined]
            ended = time.monotonic()
        if ended and time.monotonic() - ended > AFTER_S:
            break
        time.sleep(0.1)
    agent.source.close()
    agent.shipper.spool.close()
    codec = Codec()
    recs = [codec.decode(e.value) for e in transport.delivered]
    return sorted(((record_time_ns(r), r) for r in recs), key=lambda tr: tr[0])


def test_crashed_rank_stays_the_culprit_after_the_peers_are_torn_down(
    tmp_path: Path,
) -> None:
    env = harness.traced_env(tmp_path / "rings")
    del env["MYCROFT_TORCH_KEEP_RING"]  # a peer's exit removes its ring
    (tmp_path / "rings").mkdir()
    with harness.run_ranks(JOB_ARGS, env, tmp_path / "logs") as procs:
        records = _sample(tmp_path / "rings", tmp_path / "spool", procs)
        codes = [p.poll() for p in procs]  # type: ignore[attr-defined]
    logs = harness.logs(tmp_path / "logs")
    assert codes[CULPRIT] == 1 and all(c not in (None, 0) for c in codes), logs
    rp = Replay()
    with TraceFileWriter(tmp_path / "job.trace") as out:  # for mycroft analyze
        for ts, rec in records:
            out.write(rec, ts)
            rp.feed(ts, rec)
    anomalies, _ = rp.finish()
    silent = {r for a in anomalies if a.detector == "silence" for r in a.ranks}
    assert silent == {CULPRIT}, f"silence on {sorted(silent)}: the peers exited later"
    revisions: list[RootCause] = rp.revisions
    summary = [
        (r.revision, r.culprits[0].rank, r.culprits[0].subject()) for r in revisions
    ]
    assert revisions, f"the crash was not diagnosed\n{logs}"
    for rc in revisions:
        best = rc.culprits[0]
        assert (best.rank, best.kind.value) == (CULPRIT, "hang"), summary
    assert revisions[-1].culprits[0].component.value == "process", summary
