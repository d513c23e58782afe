"""One agent serves every job on its node, keyed by the ring header's job id,
and reports what the writers' BEATs counted lost or unseen."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from mycroft.producers import ring_layout as L
from mycroft.producers.agent.daemon import Agent
from mycroft.producers.agent.metrics import AgentMetrics
from mycroft.producers.agent.shipper import Shipper
from mycroft.producers.agent.sources import RingSource
from mycroft.producers.agent.spool import Spool
from mycroft.producers.ring import RingWriter
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Heartbeat, Record, StateBatch, Topology
from mycroft.topics import TopicSet

from .test_spool_shipper import FakeTransport


def _run(tmp_path: Path, job_id: str, writers: list[RingWriter]) -> list[Record]:
    """Two ticks of an agent with ``job_id`` over the rings; what it shipped."""
    tr = FakeTransport()
    agent = Agent(
        job_id=job_id,
        host="h",
        source=RingSource(tmp_path / "rings"),
        shipper=Shipper(Spool(tmp_path / "spool", 1 << 20, 1 << 12), tr),
        topics=TopicSet("p."),
        metrics=AgentMetrics(CollectorRegistry()),
    )
    agent.tick()
    for w in writers:
        w.write(L.OpIssued(7, 9, 1, 64, 0, 1, 1, 1))
    agent._last_beat = 0
    agent.tick()
    agent.shipper.pump()
    agent.source.close()
    agent.shipper.spool.close()
    codec = Codec()
    return [codec.decode(e.value) for e in tr.delivered]


def _rings(tmp_path: Path, jobs: dict[int, str]) -> list[RingWriter]:
    (tmp_path / "rings").mkdir()
    out = []
    for rank, job in jobs.items():
        w = RingWriter(
            tmp_path / "rings" / f"r{rank}.ring", rank, 64, version=4, job_id=job
        )
        w.write(L.Comm(1, 9, 2, rank, 1, 0))
        w.write(L.Beat(2, -1, 0, 1, 0, 0, 3, 2, 5))
        out.append(w)
    return out


def test_rings_of_two_jobs_ship_under_their_own_job_ids(tmp_path: Path) -> None:
    writers = _rings(tmp_path, {0: "llm-a", 1: "llm-b", 2: ""})
    recs = _run(tmp_path, "default", writers)
    states = {
        (r.header.job_id, int(r.rc["rank"][0]))
        for r in recs
        if isinstance(r, StateBatch)
    }
    assert states == {("llm-a", 0), ("llm-b", 1), ("default", 2)}
    topo = {
        r.job_id: [x.rank for x in r.ranks] for r in recs if isinstance(r, Topology)
    }
    assert topo == {"llm-a": [0], "llm-b": [1], "default": [2]}
    beats = {
        r.job_id: [h.rank for h in r.ranks] for r in recs if isinstance(r, Heartbeat)
    }
    assert beats == {"llm-a": [0], "llm-b": [1], "default": [2]}
    for w in writers:
        w.close()


def test_an_explicit_job_id_overrides_the_rings(tmp_path: Path) -> None:
    writers = _rings(tmp_path, {0: "llm-a", 1: "llm-b"})
    recs = _run(tmp_path, "pinned", writers)
    jobs = {r.header.job_id for r in recs if isinstance(r, StateBatch)}
    assert jobs == {"pinned"}
    (beat,) = {r.job_id: r for r in recs if isinstance(r, Heartbeat)}.values()
    assert [h.rank for h in beat.ranks] == [0, 1]
    for w in writers:
        w.close()


def test_the_writers_coverage_counters_reach_the_heartbeat_and_metrics(
    tmp_path: Path,
) -> None:
    writers = _rings(tmp_path, {0: "", 1: ""})
    tr = FakeTransport()
    registry = CollectorRegistry()
    agent = Agent(
        job_id="j",
        host="h",
        source=RingSource(tmp_path / "rings"),
        shipper=Shipper(Spool(tmp_path / "spool", 1 << 20, 1 << 12), tr),
        topics=TopicSet("p."),
        metrics=AgentMetrics(registry),
    )
    agent.tick()
    agent.shipper.pump()
    codec = Codec()
    (beat,) = [
        r for e in tr.delivered if isinstance(r := codec.decode(e.value), Heartbeat)
    ]
    got = [
        (h.dropped_ops, h.unseen_ops, h.abandoned_ops, h.orphan_flows)
        for h in beat.ranks
    ]
    assert got == [(1, 3, 2, 5), (1, 3, 2, 5)]
    value = registry.get_sample_value
    assert value("mycroft_agent_writer_unseen_ops_total") == 6
    assert value("mycroft_agent_writer_orphan_flows_total") == 10
    writers[0].close(unlink=True)  # a ring that goes keeps its counts
    agent._last_scan = 0
    agent.tick()
    assert value("mycroft_agent_writer_unseen_ops_total") == 6
    agent.source.close()
    agent.shipper.spool.close()
    writers[1].close()
