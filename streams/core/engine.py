"""The per-job analyzer: dedup, ingest, timer-driven detection, incidents.

A Faust agent (or the offline CLI) owns one ``Analyzer`` per job and calls
``ingest(record, now_ns)`` per decoded record and ``evaluate(now_ns)`` on a
timer; both are pure with respect to time: ``now_ns`` is always handed in.
"""

from __future__ import annotations

from mycroft.schemas.records import (
    Anomaly,
    CompletionBatch,
    Culprit,
    Evidence,
    Heartbeat,
    Record,
    StateBatch,
    Topology,
)
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.completions import CompletionTracker, RecentStats
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.contract import Contract
from mycroft.streams.core.detect import (
    DetectContext,
    detect_hangs,
    detect_mismatch,
    detect_silence,
)
from mycroft.streams.core.detect_ports import detect_port_flaps
from mycroft.streams.core.detect_slow import (
    Completed,
    block_flow_gaps,
    observe_collectives,
)
from mycroft.streams.core.detect_wire import detect_slow_wire
from mycroft.streams.core.incidents import Finding, Incident, IncidentTracker
from mycroft.streams.core.progress import ProgressStore
from mycroft.streams.core.rca_hang import explain_hang
from mycroft.streams.core.rca_mismatch import explain_mismatch
from mycroft.streams.core.rca_ports import port_failed
from mycroft.streams.core.rca_slow import explain_slowdown
from mycroft.streams.core.record_gate import RecordGate
from mycroft.streams.core.stall_rhythm import StallRhythm
from mycroft.streams.core.topology import JobTopology

_OBSERVE_BLOCK = 50_000
"""Queued completed collectives observed at once even before ``detect``
(bounds the queue of a worker that ingests a backlog; ~3 s of a 1,024-rank job)."""
_JOIN_BLOCK = 20_000
"""Queued completion rows joined at once even before ``detect`` (~0.3 s of a
1,024-rank job)."""


class Dedup:
    """Remembers batch keys ``(type, host, epoch, seq)`` within a sliding window."""

    def __init__(self, window: int = 4096) -> None:
        self.window = window
        self._seen: dict[tuple[str, str, int], set[int]] = {}
        self._max: dict[tuple[str, str, int], int] = {}

    def first_time(self, kind: str, host: str, epoch: int, seq: int) -> bool:
        """Return True the first time a key is seen (old keys count as seen)."""
        key = (kind, host, epoch)
        seen = self._seen.setdefault(key, set())
        top = self._max.get(key, -1)
        if seq in seen or seq <= top - self.window:
            return False
        seen.add(seq)
        if seq > top:
            self._max[key] = seq
            if len(seen) > 2 * self.window:
                self._seen[key] = {s for s in seen if s > seq - self.window}
        return True


class Analyzer:
    """Detection and root cause for one job.

    Args:
        job_id: The job whose records this analyzer receives.
        config: Thresholds; defaults to ``DetectorConfig()``.
        contract: Bounds of the input contract; defaults to ``Contract()``.

    ``ingest`` never emits; ``evaluate`` returns new anomalies (each anomaly id
    once) and root causes (one incident id per incident, ``revision`` + 1 when
    its culprits change), anomalies first.
    """

    def __init__(
        self,
        job_id: str,
        config: DetectorConfig | None = None,
        contract: Contract | None = None,
    ) -> None:
        self.cfg = config or DetectorConfig()
        self.ctx = DetectContext(
            job_id,
            ProgressStore(
                self.cfg.history_ns,
                (self.cfg.transfer_rows_per_rank, self.cfg.transfer_rows_min),
                self.cfg.ready_wait_chunks,
            ),
            JobTopology(),
            BaselineBook(self.cfg.baseline_window, self.cfg),
            self.cfg,
        )
        self.tracker = CompletionTracker()
        self.dedup = Dedup()
        self.gate = RecordGate(contract)
        self.stats = RecentStats()
        self.incidents = IncidentTracker(job_id, self.cfg, self.ctx.topo)
        self.rhythm = StallRhythm(self.cfg)
        self._pending: list[Anomaly] = []
        self._unobserved: list[Completed] = []
        self.duplicates = 0

    @property
    def incident(self) -> Incident | None:
        """The open incident, if any."""
        return self.incidents.incident

    @property
    def closed(self) -> list[Incident]:
        """Incidents closed so far."""
        return self.incidents.closed

    def ingest(self, record: Record, now_ns: int) -> None:
        """Fold one decoded record in; duplicates are counted and ignored.

        Records pass the job's :class:`RecordGate` first: rows that break
        the input contract never reach state (``gate.take()`` lists them),
        nor the dedup window (a wrong record with a huge ``agent_seq``
        would make the host's next batches look old). Rows the gate held
        and releases now are deduplicated apart from their record's others.
        """
        parts = self.gate.admit(record, now_ns)
        own = len(parts) - self.gate.released
        for i, part in enumerate(parts):
            if self._first_time(part, "" if i < own else "held:"):
                self._fold(part, now_ns)

    def _first_time(self, record: Record, kind: str) -> bool:
        """Whether a batch's key is new (other records: always)."""
        if not isinstance(record, StateBatch | CompletionBatch):
            return True
        h = record.header
        name = kind + type(record).__name__
        if self.dedup.first_time(name, h.host, h.agent_epoch, h.agent_seq):
            return True
        self.duplicates += 1
        return False

    def _fold(self, record: Record, now_ns: int) -> None:
        """Fold one record the gate admitted into state."""
        if isinstance(record, StateBatch):
            self.ctx.store.ingest_state(record, now_ns)
        elif isinstance(record, CompletionBatch):
            self._ingest_completion(record, now_ns)
        elif isinstance(record, Heartbeat):
            self.ctx.store.touch(record.host, record.ts_ns, now_ns, record.nics)
        elif isinstance(record, Topology):
            self.ctx.topo.add(record)

    def _ingest_completion(self, batch: CompletionBatch, now_ns: int) -> None:
        self.ctx.store.ingest_completion(batch, now_ns)
        self.tracker.add(batch, now_ns)
        if self.tracker.queued_rows >= _JOIN_BLOCK:
            self._join()

    def _join(self) -> None:
        """Join the queued completions; queue the collectives they complete."""
        done = self.tracker.join(self.ctx.topo.comm_sizes())
        stats = [stat for stat, _ in done]
        gaps = block_flow_gaps(self.ctx, stats)
        self.stats.extend(stats)
        self._unobserved += [
            (stat, now_ns, op_gaps)
            for (stat, now_ns), op_gaps in zip(done, gaps, strict=True)
        ]
        if len(self._unobserved) >= _OBSERVE_BLOCK:
            self._observe()

    def _observe(self) -> None:
        """Feed the queued collectives to the slowdown baselines as one block.

        Runs before anything reads the baselines (``detect``), so the
        verdicts are those of observing each collective as it completed.
        """
        self._pending.extend(observe_collectives(self.ctx, self._unobserved))
        self._unobserved = []

    def evaluate(self, now_ns: int) -> list[Finding]:
        """Run the timer-driven detectors; return new anomalies and root causes."""
        self.gate.expire(now_ns)
        return self.track(self.detect(now_ns), now_ns)

    def detect(self, now_ns: int) -> list[Anomaly]:
        """Return every anomaly firing now (repeats included), no incident logic.

        Slowdowns found while ingesting completions are returned once, but
        not those of ops a recurring pause held up (``stall_rhythm``).
        """
        self._join()
        self._observe()
        hangs = detect_hangs(self.ctx, now_ns, self.rhythm)
        found = (
            self.rhythm.excuse(self._pending)
            + detect_silence(self.ctx, now_ns)
            + hangs
            + detect_mismatch(self.ctx, now_ns, self.tracker.signature_rows())
            + detect_port_flaps(self.ctx, now_ns)
            + detect_slow_wire(self.ctx, now_ns)
        )
        self._pending = []
        self.tracker.expire(now_ns, int(self.cfg.completion_timeout_s * 1e9))
        return found

    def track(self, found: list[Anomaly], now_ns: int) -> list[Finding]:
        """Fold the anomalies firing now into the incident; return what is new."""
        return self.incidents.track(found, now_ns, self.explain, self.port_turn)

    def port_turn(self, culprits: list[Culprit], inc: Incident) -> bool:
        """Whether a port event overturns the published answer.

        Both ends of a dead link stall together, and the first answer may
        name the far end, confidently, before the failed port's first
        heartbeat arrives. A new top culprit on another rank whose port went
        down, against a published one whose port stayed up, revises it
        whatever the confidences: the port is the only evidence that tells
        the two ends apart.
        """
        old = inc.published.culprits[0] if inc.published else None
        new = culprits[0]
        if old is None or old.rank == new.rank or new.component is not Component.NIC:
            return False
        since = inc.since_ns
        return port_failed(self.ctx, new.rank, since) and not port_failed(
            self.ctx, old.rank, since
        )

    def explain(
        self, inc: Incident, kind: FaultKind, now_ns: int
    ) -> tuple[list[Culprit], list[Evidence]]:
        """The single-stage explainer (:data:`~.incidents.Explainer`): from
        this job's own flows, collectives and port events."""
        anomalies = list(inc.anomalies.values())
        if kind is FaultKind.MISMATCH:
            found: tuple[list[Culprit], list[Evidence]] = explain_mismatch(
                self.ctx, [a for a in anomalies if a.kind is FaultKind.MISMATCH]
            )
            return found
        if kind is FaultKind.HANG:
            ranks = {r for a in anomalies for r in a.ranks}
            hung: tuple[list[Culprit], list[Evidence]] = explain_hang(
                self.ctx, ranks, now_ns, inc.since_ns
            )
            return hung
        since = inc.since_ns
        slow: tuple[list[Culprit], list[Evidence]] = explain_slowdown(
            self.ctx, self.stats.since(since), since
        )
        return slow


__all__ = ["Analyzer", "DetectorConfig", "Finding", "Incident"]
