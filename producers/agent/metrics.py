"""The agent's own Prometheus metrics, on an injected registry (never the global)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class Snapshot:
    """Cumulative agent counters at one moment."""

    records_read: int
    batches_made: int
    batches_sent: int
    batches_spooled: int
    spool_dropped: int
    delivery_failures: int
    ring_overwrites: int
    ring_corrupt: int
    spool_pending: int
    spool_bytes: int
    sampling_lag_s: float
    ring_lag_records: int
    rings: int
    kafka_up: int
    """1 while the agent ships, 0 while Kafka is unreachable and it spools."""
    writer_dropped_comms: int = 0
    """The writers' own BEAT counters, summed over every ring read
    (``schemas/ring.md`` §4c; the NCCL plugin's coverage)."""
    writer_dropped_ops: int = 0
    writer_dropped_flows: int = 0
    writer_unseen_ops: int = 0
    writer_abandoned_ops: int = 0
    writer_orphan_flows: int = 0


_COUNTERS = {
    "records_read": "raw ring records read",
    "batches_made": "batches (state, completion, heartbeat, topology) made and spooled",
    "batches_sent": "batches acknowledged by Kafka",
    "batches_spooled": "batches that waited in the disk spool for Kafka",
    "spool_dropped": "batches lost because the spool was full",
    "delivery_failures": "failed delivery attempts",
    "ring_overwrites": "ring records overwritten before they were read",
    "ring_corrupt": "ring slots skipped as corrupt",
    "writer_dropped_comms": "communicators a ring writer could not track (its BEAT)",
    "writer_dropped_ops": "ops a ring writer could not track (its BEAT)",
    "writer_dropped_flows": "flows a ring writer could not track (its BEAT)",
    "writer_unseen_ops": "collectives NCCL ran without telling the profiler plugin "
    "(its BEAT)",
    "writer_abandoned_ops": "ops released without completion: communicator destroyed "
    "or aborted mid-op (its BEAT)",
    "writer_orphan_flows": "flows NCCL started and never stepped or stopped: CollNet, "
    "CUDA-memcpy P2P (its BEAT)",
}
_GAUGES = {
    "spool_pending": (
        "mycroft_agent_spool_pending_batches",
        "batches not yet acknowledged",
    ),
    "spool_bytes": ("mycroft_agent_spool_bytes", "bytes on disk in the spool"),
    "sampling_lag_s": (
        "mycroft_agent_sampling_lag_seconds",
        "how late the last tick ran",
    ),
    "ring_lag_records": (
        "mycroft_agent_ring_lag_records",
        "records in rings not read yet",
    ),
    "rings": ("mycroft_agent_rings", "ring buffers being read"),
    "kafka_up": (
        "mycroft_agent_kafka_up",
        "1 while shipping to Kafka, 0 while it is unreachable (spooling)",
    ),
}


class AgentMetrics:
    """Counters ``mycroft_agent_<name>_total`` and gauges, synced from snapshots."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counters = {
            k: Counter(f"mycroft_agent_{k}", doc, registry=registry)
            for k, doc in _COUNTERS.items()
        }
        self._gauges = {
            k: Gauge(n, doc, registry=registry) for k, (n, doc) in _GAUGES.items()
        }
        self._last: dict[str, float] = dict.fromkeys(_COUNTERS, 0.0)

    def update(self, snap: Snapshot) -> None:
        """Advance counters by what changed since the last snapshot; set gauges."""
        for key, counter in self._counters.items():
            value = float(getattr(snap, key))
            if value > self._last[key]:
                counter.inc(value - self._last[key])
                self._last[key] = value
        for key, gauge in self._gauges.items():
            gauge.set(float(getattr(snap, key)))
