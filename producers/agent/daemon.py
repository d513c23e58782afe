"""The agent loop: every tick drain the source, batch, spool and ship.

Per tick (``interval_ms``) and per training job on the host: fold new ring
records, make one ``StateBatch`` (when any rank is known), one
``CompletionBatch`` (when ops completed), a ``Topology`` when communicators
changed, a ``Heartbeat`` every ``heartbeat_s``; spool them with the source
checkpoint in one write; produce.

One agent serves every job on its node: a ring's job is the ``job_id`` its
writer put in the header (``schemas/ring.md`` §2: ``MYCROFT_JOB_ID`` or the
launcher's id), else the agent's ``job_id``; an agent started with an
explicit ``job_id`` other than ``default`` puts every ring under it (the
override for writers that cannot know their job).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from mycroft.producers.agent.aggregate import Aggregator
from mycroft.producers.agent.metrics import AgentMetrics, Snapshot
from mycroft.producers.agent.nics import read_ports
from mycroft.producers.agent.shipper import Shipper
from mycroft.producers.agent.sources import ReplaySource, RingSource
from mycroft.producers.agent.spool import Entry
from mycroft.producers.ring_layout import RingHeader
from mycroft.producers.tracefile import Frame
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import (
    BatchHeader,
    CommMembership,
    CompletionBatch,
    Heartbeat,
    NicPort,
    RankTopology,
    Record,
    StateBatch,
    Topology,
)
from mycroft.stop_signal import Stopper
from mycroft.topics import TopicSet

log = logging.getLogger(__name__)

INTERRUPT_FLUSH_S = 1.0
"""Longest wait for deliveries after Ctrl-C (SIGINT), s: stops within 2 s."""
DEFAULT_JOB_ID = "default"
"""The agent's job id when none is set: rings then keep their own."""


class Agent:
    """One node agent incarnation (``agent_epoch`` = its start time in ns).

    Args:
        job_id, host: identity stamped on every batch.
        source: a ring or replay source.
        shipper: spool + Kafka.
        topics: topic names.
        interval_ms, heartbeat_s: tick and heartbeat periods.
        metrics: Prometheus metrics, or None.
        nic_sysfs: RDMA sysfs folder whose port state each heartbeat of a ring
            source carries (``""``: none). Simulated and replayed traces bring
            their own heartbeats; the agent's own then carry no ports.
    """

    def __init__(
        self,
        *,
        job_id: str,
        host: str,
        source: RingSource | ReplaySource,
        shipper: Shipper,
        topics: TopicSet,
        interval_ms: int = 100,
        heartbeat_s: float = 1.0,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], int] = time.time_ns,
        nic_sysfs: str = "",
    ) -> None:
        self.job_id, self.host, self.source, self.shipper = (
            job_id,
            host,
            source,
            shipper,
        )
        self.topics, self.interval_ms, self.heartbeat_s = (
            topics,
            interval_ms,
            heartbeat_s,
        )
        self.metrics, self._clock = metrics, clock
        self.nic_sysfs = nic_sysfs
        self._nic_warned: set[str] = set()
        self.codec = Codec()
        self.agg = Aggregator()
        """The aggregator of the agent's own ``job_id`` (every ring, when it
        is an override); other jobs get theirs in ``jobs``."""
        self.jobs: dict[str, Aggregator] = {job_id: self.agg}
        self.override = job_id != DEFAULT_JOB_ID
        self.epoch = clock()
        self.seq = 0
        self.records_read = 0
        self.batches_made = 0
        self.lag_s = 0.0
        self._last_beat = self._last_scan = self._last_commit = 0
        self._started = time.monotonic()

    def _header(self, job: str, tick_ns: int) -> BatchHeader:
        self.seq += 1
        return BatchHeader(
            job, self.host, self.epoch, self.seq, tick_ns, self.interval_ms
        )

    def _entry(self, record: Record, job: str | None = None) -> Entry:
        job = self.job_id if job is None else job
        topic = self.topics.for_record(type(record).__name__)
        key = f"{job}/{self.host}" if isinstance(record, Topology) else job
        return Entry(topic, key, job, self.codec.encode(record))

    def job_of(self, header: RingHeader) -> str:
        """The job a ring's records go to (module docstring)."""
        return self.job_id if self.override or not header.job_id else header.job_id

    def _route(self, header: RingHeader) -> Aggregator:
        job = self.job_of(header)
        if job not in self.jobs:
            log.info("job %s: first ring on this host (rank %d)", job, header.rank)
            self.jobs[job] = Aggregator()
        return self.jobs[job]

    def tick(self) -> None:
        """One sampling tick."""
        now = self._clock()
        entries = (
            self._ring_tick(now)
            if isinstance(self.source, RingSource)
            else (self._replay_tick())
        )
        if now - self._last_beat >= self.heartbeat_s * 1e9:
            self._last_beat = now
            beat_ns = self._beat_ns(now)
            for job in self._beating():
                entries.append(self._entry(self.heartbeat(beat_ns, job), job))
            self._forget_ended_jobs()
        self.batches_made += len(entries)
        self.shipper.submit(entries, self.source.checkpoint())
        if now - self._last_commit >= 1e9:  # a stale ack cursor only means duplicates
            self._last_commit = now
            self.shipper.spool.commit()
        if self.metrics is not None:
            self.metrics.update(self.snapshot())

    def _ring_tick(self, now: int) -> list[Entry]:
        src = self.source
        assert isinstance(src, RingSource)  # noqa: S101 - narrowed by tick()
        if now - self._last_scan >= 1e9:  # new or removed rings: once a second
            self._last_scan = now
            src.scan(self._route)
        self.records_read += src.drain()
        out: list[Entry] = []
        for job, agg in self.jobs.items():
            rows = agg.tick()
            if agg.topology_changed:
                agg.topology_changed = False
                out.append(self._entry(self.topology(now, job), job))
            if len(rows.rc):
                header = self._header(job, now)
                out.append(
                    self._entry(StateBatch(header, rows.rc, rows.op, rows.flow), job)
                )
            if len(rows.done_op):
                header = self._header(job, now)
                done = CompletionBatch(header, rows.done_op, rows.done_flow)
                out.append(self._entry(done, job))
        return out

    def _beating(self) -> list[str]:
        """Jobs a heartbeat goes to: the agent's own always, others while
        they have rings here (one more beat after their last ring went)."""
        return list(self.jobs)

    def _forget_ended_jobs(self) -> None:
        """Drop jobs other than the agent's own whose rings are all gone."""
        for job in [
            j for j, a in self.jobs.items() if j != self.job_id and not a.ranks
        ]:
            log.info("job %s: no ring left on this host", job)
            del self.jobs[job]

    def _replay_tick(self) -> list[Entry]:
        src = self.source
        assert isinstance(src, ReplaySource)  # noqa: S101 - narrowed by tick()
        frames: list[Frame] = src.take(time.monotonic() - self._started)
        self.records_read += len(frames)
        return [
            Entry(
                self.topics.for_record(f.record_type),
                f.key,
                f.key.split("/")[0],
                f.value,
            )
            for f in frames
        ]

    def topology(self, now: int, job: str | None = None) -> Topology:
        """This host's ranks of ``job`` (default: the agent's own) and the
        communicators each joined (from COMM records)."""
        job = self.job_id if job is None else job
        agg = self.jobs[job]
        ranks = tuple(
            RankTopology(
                st.rank,
                st.local_rank,
                "",
                "",
                tuple(
                    CommMembership(c, cs.name, cs.nranks, cs.comm_rank, agg.members(c))
                    for c, cs in sorted(st.comms.items())
                    if cs.nranks > 0
                ),
            )
            for st in sorted(agg.ranks.values(), key=lambda s: s.rank)
        )
        return Topology(job, self.host, "", now, ranks)

    def _beat_ns(self, now: int) -> int:
        """A heartbeat's time: now, or replaying a trace, the trace time of
        the newest frame sent (the records' own clock, so that a worker
        orders the beat among them instead of years ahead of them)."""
        if isinstance(self.source, ReplaySource) and self.source.trace_ns:
            return self.source.trace_ns
        return now

    def heartbeat(self, now: int, job: str | None = None) -> Heartbeat:
        """Liveness, loss counters (cumulative since ``agent_epoch``), NIC ports
        of ``job`` (default: the agent's own); the agent's counters are the
        whole agent's."""
        job = self.job_id if job is None else job
        sh = self.shipper
        src = self.source
        ranks = src.health(self.jobs[job]) if isinstance(src, RingSource) else ()
        return Heartbeat(
            job,
            self.host,
            self.epoch,
            now,
            self.interval_ms,
            self.lag_s * 1e3,
            self.records_read,
            sh.sent,
            sh.spooled,
            sh.spool.pending,
            sh.spool.dropped + sh.rejected,
            sh.failures,
            ranks,
            self.nics(),
        )

    def nics(self) -> tuple[NicPort, ...]:
        """This host's RDMA ports, when reading them is on and the source is rings."""
        if not self.nic_sysfs or not isinstance(self.source, RingSource):
            return ()
        return read_ports(self.nic_sysfs, self._nic_warned)

    def snapshot(self) -> Snapshot:
        """Counters for the metrics endpoint."""
        sh = self.shipper
        src = self.source if isinstance(self.source, RingSource) else None
        return Snapshot(
            self.records_read,
            self.batches_made,
            sh.sent,
            sh.spooled,
            sh.spool.dropped + sh.rejected,
            sh.failures,
            src.overwritten() if src else 0,
            src.corrupt() if src else 0,
            sh.spool.pending,
            sh.spool.size_bytes,
            self.lag_s,
            src.lag_records() if src else 0,
            len(src.readers) if src else 0,
            int(sh.healthy),
            **{f"writer_{k}": v for k, v in (src.coverage() if src else {}).items()},
        )

    def run(
        self, stop: Stopper, duration_s: float = 0.0, flush_s: float = 10.0
    ) -> dict[str, Any]:
        """Tick until ``stop`` is set (SIGTERM) or ``duration_s`` passed; then flush."""
        period = self.interval_ms / 1e3
        start = next_at = time.monotonic()
        while not stop.is_set():
            self.lag_s = max(0.0, time.monotonic() - next_at)
            self.tick()
            if duration_s and time.monotonic() - start >= duration_s:
                break
            if (
                isinstance(self.source, ReplaySource)
                and self.source.finished
                and self.shipper.spool.pending == 0
            ):
                break
            next_at += period
            # Sleep, then serve callbacks: librdkafka's poll(timeout) returns
            # early on internal events, which made this loop spin ~700 times/s.
            while (wait := next_at - time.monotonic()) > 0 and not stop.is_set():
                stop.wait(min(wait, 0.05))
                self.shipper.pump()
            if wait < -10 * period:  # far behind (suspended): do not burst
                next_at = time.monotonic()
        if stop.is_set():
            log.info("stop requested (%s): flushing and stopping", stop)
        if getattr(stop, "signum", 0) == signal.SIGINT:
            # Ctrl-C: a person waits. Every record is in the spool on disk
            # already, so a short flush loses nothing; SIGTERM waits flush_s.
            flush_s = min(flush_s, INTERRUPT_FLUSH_S)
        self.tick()  # what was written up to SIGTERM
        left = self.shipper.flush(flush_s)
        self.shipper.spool.close()
        log.info(
            "agent stopped: %d sent, %d left in the spool for the next start",
            self.shipper.sent,
            left,
        )
        return {"sent": self.shipper.sent, "pending": left}
