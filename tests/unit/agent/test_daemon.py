"""The agent tick end to end with a fake Kafka: batches, heartbeat losses, metrics."""

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
from mycroft.schemas.records import CompletionBatch, Heartbeat, StateBatch, Topology
from mycroft.topics import TopicSet

from .test_spool_shipper import FakeTransport


def _agent(
    tmp_path: Path,
    rings: Path,
    tr: FakeTransport,
    registry: CollectorRegistry,
    retry_s: float = 1.0,
) -> Agent:
    """An agent reading ``rings``, shipping through ``tr``, metrics in ``registry``."""
    spool = Spool(tmp_path / "spool", 1 << 20, 1 << 12)
    return Agent(
        job_id="j",
        host="h",
        source=RingSource(rings),
        shipper=Shipper(spool, tr, retry_s=retry_s),
        topics=TopicSet("p."),
        metrics=AgentMetrics(registry),
    )


def test_tick_makes_state_completion_topology_and_heartbeat(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    w = RingWriter(rings / "r3.ring", rank=3, nslots=8)
    w.write(L.Comm(1, 9, 8, 3, 1, 0))
    w.write(L.OpIssued(2, 9, 0, 64, 0, 1, 1, 1))
    w.write(L.FlowDone(5, 9, 0, 3, 0, 0, 4, 2))
    w.write(L.OpDone(6, 9, 0, 3, 1))
    w.write(L.OpIssued(7, 9, 1, 64, 0, 1, 1, 1))
    w.flow_progress(8, 9, 1, 0, 0, 4, 2, 1, 0, 0)
    tr = FakeTransport()
    registry = CollectorRegistry()
    agent = _agent(tmp_path, rings, tr, registry)
    agent.tick()
    for i in range(20):  # the reader is behind by more than 8 slots: overwrites
        w.write(L.Beat(10 + i, i))
    agent._last_beat = 0
    agent.tick()
    agent.shipper.pump()
    codec = Codec()
    recs = [codec.decode(e.value) for e in tr.delivered]
    states = [r for r in recs if isinstance(r, StateBatch)]
    done = [r for r in recs if isinstance(r, CompletionBatch)]
    beats = [r for r in recs if isinstance(r, Heartbeat)]
    assert any(isinstance(r, Topology) for r in recs)
    assert states[0].op["seq"].tolist() == [1]
    assert states[0].flow.tolist() == [(0, 4, 0, 2, 1, 0, 0, 8, 0)]
    assert done[0].op["seq"].tolist() == [0]
    seqs = [r.header.agent_seq for r in states + done]
    assert len(set(seqs)) == len(seqs)
    assert beats[-1].ranks[0].ring_overwrites == 12
    assert registry.get_sample_value("mycroft_agent_ring_overwrites_total") == 12
    assert registry.get_sample_value("mycroft_agent_records_read_total") == 14
    agent.source.close()
    agent.shipper.spool.close()
    w.close()


def test_metrics_agree_with_the_log_while_kafka_is_away(tmp_path: Path) -> None:
    """Once librdkafka says no broker answers, the agent's gauges say so and
    what it makes counts as spooled: pending batches are spooled batches."""
    rings = tmp_path / "rings"
    rings.mkdir()
    w = RingWriter(rings / "r0.ring", rank=0, nslots=64)
    w.write(L.Comm(1, 9, 8, 0, 1, 0))
    tr = FakeTransport()
    registry = CollectorRegistry()
    agent = _agent(tmp_path, rings, tr, registry, retry_s=0.0)
    tr.hold, tr.down = True, "Kafka at 127.0.0.1:9 unreachable (no broker answers)"
    agent.shipper.pump()
    for i in range(3):
        w.write(L.OpIssued(2 + i, 9, i, 64, 0, 1, 1, 1))
        agent._last_beat = 0
        agent.tick()
    value = registry.get_sample_value
    assert value("mycroft_agent_kafka_up") == 0
    spooled = value("mycroft_agent_batches_spooled_total")
    assert spooled is not None and spooled > 0
    assert value("mycroft_agent_spool_pending_batches") == agent.shipper.spool.pending
    assert value("mycroft_agent_batches_sent_total") == 0
    tr.hold = False
    for _ in range(3):
        agent.shipper.pump()
        agent.tick()
    assert value("mycroft_agent_kafka_up") == 1
    agent.source.close()
    agent.shipper.spool.close()
    w.close()
