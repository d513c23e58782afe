"""The per-job analyzer: dedup, ingest, timer-driven detection, incidents.

A Faust agent (or the offline CLI) owns one ``Analyzer`` per job and calls
``ingest(record, now_ns)`` per decoded record and ``evaluate(now_ns)`` on a
timer; both are pure with respect to time: ``now_ns`` is always handed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from mycroft.schemas.records import (
    Anomaly,
    CompletionBatch,
    Culprit,
    Evidence,
    Heartbeat,
    Record,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.schemas.text import comm_hex
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.completions import CompletionTracker, RecentStats
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.contract import Contract
from mycroft.streams.core.culprit_scope import scope_culprits
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
from mycroft.streams.core.progress import ProgressStore
from mycroft.streams.core.rca_hang import explain_hang
from mycroft.streams.core.rca_mismatch import explain_mismatch
from mycroft.streams.core.rca_ports import port_failed
from mycroft.streams.core.rca_slow import explain_slowdown
from mycroft.streams.core.record_gate import RecordGate
from mycroft.streams.core.scoring import HOSTWIDE_CONF, MIN_CULPRIT_CONFIDENCE, PEERS
from mycroft.streams.core.topology import JobTopology

Finding: TypeAlias = Anomaly | RootCause
_PRIORITY = {FaultKind.MISMATCH: 0, FaultKind.HANG: 1, FaultKind.SLOWDOWN: 2}
_REEVAL_NS = 1_000_000_000
_REEVAL_MAX_NS = 4_000_000_000
"""A slowdown's root cause reads every collective kept since its onset (a
refresh costs 0.7-1.0 CPU s at 1,024 ranks): while its answer holds and no new
anomaly joins, it is refreshed half as often each time, down to this period."""
_OBSERVE_BLOCK = 50_000
"""Queued completed collectives observed at once even before ``detect``
(bounds the queue of a worker that ingests a backlog; ~3 s of a 1,024-rank job)."""
_JOIN_BLOCK = 20_000
"""Queued completion rows joined at once even before ``detect`` (~0.3 s of a
1,024-rank job)."""


@dataclass
class Incident:
    """One ongoing problem: its anomalies and the last root cause emitted."""

    incident_id: str
    kind: FaultKind
    onset_ns: int
    detected_ns: int
    anomalies: dict[str, Anomaly] = field(default_factory=dict)
    last_active_ns: int = 0
    last_rca_ns: int = 0
    revision: int = -1
    signature: tuple[object, ...] = ()
    top_conf: float = 0.0
    proposed: tuple[object, ...] = ()  # the last round's answer, published or not
    rca_period_ns: int = _REEVAL_NS  # see _next_period


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
            ProgressStore(self.cfg.history_ns),
            JobTopology(),
            BaselineBook(self.cfg.baseline_window, self.cfg),
            self.cfg,
        )
        self.tracker = CompletionTracker()
        self.dedup = Dedup()
        self.gate = RecordGate(contract)
        self.stats = RecentStats()
        self.incident: Incident | None = None
        self.closed: list[Incident] = []
        self._pending: list[Anomaly] = []
        self._unobserved: list[Completed] = []
        self._emitted: set[str] = set()
        self.duplicates = 0

    def __setstate__(self, state: dict[str, object]) -> None:
        """Restore a snapshot (one taken before the record gate has none)."""
        self.__dict__.update(state)
        self.__dict__.setdefault("gate", RecordGate())

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

        Slowdowns found while ingesting completions are returned once.
        """
        self._join()
        self._observe()
        found = (
            self._pending
            + detect_silence(self.ctx, now_ns)
            + detect_hangs(self.ctx, now_ns)
            + detect_mismatch(self.ctx, now_ns, self.tracker.signature_rows())
            + detect_port_flaps(self.ctx, now_ns)
        )
        self._pending = []
        self.tracker.expire(now_ns, int(self.cfg.completion_timeout_s * 1e9))
        return found

    def track(self, found: list[Anomaly], now_ns: int) -> list[Finding]:
        """Fold the anomalies firing now into the incident; return what is new."""
        out: list[Finding] = []
        inc = self.incident
        if inc is not None and found:
            inc.last_active_ns = now_ns
        if (
            inc is not None
            and not found
            and now_ns - inc.last_active_ns > self.cfg.incident_quiet_s * 1e9
        ):
            self.closed.append(inc)
            self.incident = inc = None
        for a in found:
            if a.anomaly_id in self._emitted or not self._novel(a):
                continue
            self._emitted.add(a.anomaly_id)
            if self.incident is None:
                self.incident = Incident(
                    _incident_id(a), a.kind, a.onset_ns, now_ns, last_active_ns=now_ns
                )
            self.incident.anomalies[a.anomaly_id] = a
            self.incident.rca_period_ns = _REEVAL_NS
            if len(self.incident.anomalies) <= self.cfg.incident_max_anomalies:
                out.append(a)
        rc = self._resolve(now_ns)
        return out + ([rc] if rc is not None else [])

    def _novel(self, a: Anomaly) -> bool:
        inc = self.incident
        if inc is None:
            return True
        return not any(
            o.detector == a.detector and o.comms == a.comms and o.ranks == a.ranks
            for o in inc.anomalies.values()
        )

    def _resolve(self, now_ns: int) -> RootCause | None:
        inc = self.incident
        if inc is None or not inc.anomalies:
            return None
        fresh = inc.revision < 0 or now_ns - inc.last_rca_ns >= inc.rca_period_ns
        if not fresh:
            return None
        inc.last_rca_ns = now_ns
        kind = min((a.kind for a in inc.anomalies.values()), key=_PRIORITY.__getitem__)
        culprits, evidence = self._explain(inc, kind, now_ns)
        if not culprits:
            return None
        sig = (
            kind,
            tuple((c.rank, c.component, c.peer, c.channel) for c in culprits[:3]),
        )
        escalated = bool(inc.signature) and inc.signature[0] != kind
        again, inc.proposed = inc.proposed == sig, sig
        inc.rca_period_ns = _next_period(inc.rca_period_ns, kind, again=again)
        if sig == inc.signature:
            if not _firmed(culprits, inc):
                return None
        elif (
            inc.revision >= 0
            and not escalated
            and not _better(culprits, inc, again=again)
            and not self._port_turn(culprits, inc)
        ):
            return None
        inc.top_conf = culprits[0].confidence
        inc.signature, inc.kind, inc.revision = sig, kind, inc.revision + 1
        return RootCause(
            incident_id=inc.incident_id,
            revision=inc.revision,
            job_id=self.ctx.job_id,
            kind=kind,
            culprits=tuple(scope_culprits(culprits, self.ctx.topo)),
            evidence=tuple(evidence[:24]),
            anomaly_ids=tuple(
                sorted(list(inc.anomalies)[: self.cfg.incident_max_anomalies])
            ),
            onset_ns=min(a.onset_ns for a in inc.anomalies.values()),
            detected_ns=inc.detected_ns,
            resolved_ns=now_ns,
        )

    def _port_turn(self, culprits: list[Culprit], inc: Incident) -> bool:
        """Whether a port event overturns the published answer.

        Both ends of a dead link stall together, and the first answer may
        name the far end, confidently, before the failed port's first
        heartbeat arrives. A new top culprit on another rank whose port went
        down, against a published one whose port stayed up, revises it
        whatever the confidences: the port is the only evidence that tells
        the two ends apart.
        """
        old = _published_top(inc)
        new = culprits[0]
        if old is None or not isinstance(old[0], int) or old[0] == new.rank:
            return False
        if new.component is not Component.NIC:
            return False
        since = min(a.onset_ns for a in inc.anomalies.values())
        return port_failed(self.ctx, new.rank, since) and not port_failed(
            self.ctx, old[0], since
        )

    def _explain(
        self, inc: Incident, kind: FaultKind, now_ns: int
    ) -> tuple[list[Culprit], list[Evidence]]:
        anomalies = list(inc.anomalies.values())
        if kind is FaultKind.MISMATCH:
            found: tuple[list[Culprit], list[Evidence]] = explain_mismatch(
                self.ctx, [a for a in anomalies if a.kind is FaultKind.MISMATCH]
            )
            return found
        if kind is FaultKind.HANG:
            ranks = {r for a in anomalies for r in a.ranks}
            since = min(a.onset_ns for a in anomalies)
            hung: tuple[list[Culprit], list[Evidence]] = explain_hang(
                self.ctx, ranks, now_ns, since
            )
            return hung
        since = min(a.onset_ns for a in anomalies)
        culprits, ev = explain_slowdown(self.ctx, self.stats.since(since), since)
        return [c for c in culprits if c.confidence >= MIN_CULPRIT_CONFIDENCE][:8], ev


def _next_period(period_ns: int, kind: FaultKind, *, again: bool) -> int:
    """The next refresh period of an incident's root cause.

    A slowdown's answer that held (``again``) is refreshed half as often,
    down to ``_REEVAL_MAX_NS``; a changed answer, and every hang or mismatch
    (cheap, and revised by events such as a port going down), every
    ``_REEVAL_NS``.
    """
    if kind is FaultKind.SLOWDOWN and again:
        return min(2 * period_ns, _REEVAL_MAX_NS)
    return _REEVAL_NS


def _better(culprits: list[Culprit], inc: Incident, *, again: bool) -> bool:
    """Whether ``culprits`` should revise the incident's published answer.

    A more confident top culprit does. So does one as confident when the
    published answer was a capped one (``HOSTWIDE_CONF``) whose top culprit
    is no longer named at all, and the same answer was proposed in the
    previous round too (``again``): its evidence is gone (an early, weak
    verdict on a few ms of noise, capped like the verdict that replaces it,
    must not stand for the rest of the incident), and not for one round
    only (a rule whose conditions hold in one window flickers). So does a
    slowdown's published runner-up that now leads alone, proposed twice
    (``_runner_up_alone``). Otherwise an uncapped answer is not revised at
    equal confidence: live, a worker's partial view (a lost rank seen alive
    again after a restore or a rebalance) would flip a right answer to a
    wrong one.
    """
    top = culprits[0].confidence
    if top > inc.top_conf:
        return True
    if not again:
        return False
    if _runner_up_alone(culprits, inc):
        return True
    if inc.top_conf > HOSTWIDE_CONF:
        return False
    old = _published_top(inc)
    named = {(c.rank, c.component, c.peer, c.channel) for c in culprits}
    return old is not None and old not in named and top >= inc.top_conf


def _runner_up_alone(culprits: list[Culprit], inc: Incident) -> bool:
    """Whether a slowdown's published runner-up now leads an answer that no
    longer names the published top culprit's rank at all.

    Both ends of the same backlogged flows are named when only they are
    flagged (a sending GPU's proxy and the receiving GPU's PCIe read alike),
    and the first answer leads with one of them. When more flows arrive and
    single out the other end, the first one's evidence is gone; among a
    thousand ranks the new answer's share of the score is diluted by small
    timing suspects, so its confidence alone would never revise the tie.
    """
    published = inc.signature[1] if len(inc.signature) > 1 else ()
    if inc.signature[:1] != (FaultKind.SLOWDOWN,) or not isinstance(published, tuple):
        return False
    tops = [p for p in published[:2] if isinstance(p, tuple)]
    if len(tops) < PEERS:
        return False
    (old_rank, *_), (up_rank, up_comp, *_) = tops
    new = culprits[0]
    return (new.rank, new.component) == (up_rank, up_comp) and all(
        c.rank != old_rank for c in culprits
    )


def _firmed(culprits: list[Culprit], inc: Incident) -> bool:
    """Whether the same answer, published capped (``HOSTWIDE_CONF``), now
    stands uncapped: it is published again, so that readers see it confirmed
    and a later answer needs more than the cap to revise it."""
    return inc.top_conf <= HOSTWIDE_CONF < culprits[0].confidence


def _published_top(inc: Incident) -> tuple[object, ...] | None:
    """``(rank, component, peer, channel)`` of the published top culprit."""
    published = inc.signature[1] if len(inc.signature) > 1 else ()
    if isinstance(published, tuple) and published:
        top = published[0]
        return top if isinstance(top, tuple) else None
    return None


def _incident_id(a: Anomaly) -> str:
    comm = comm_hex(a.comms[0]) if a.comms else "job"
    return f"{a.job_id}:{a.kind.value}:{comm}:{a.onset_ns}"


__all__ = ["Analyzer", "DetectorConfig", "Finding", "Incident"]
