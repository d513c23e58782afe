"""Stage 1 of the two-stage worker: detection and local root cause per comm group.

A ``CommAnalyzer`` owns one (job, comm group). It is the job's
:class:`~mycroft.streams.core.engine.Analyzer` fed only the rows of the
group's communicators (``comm_split.split_by_comm``) plus every topology
record and the NIC port state of heartbeats, so detectors, baselines and the
wait-for graph are exactly the single-stage ones restricted to those
communicators. Instead of managing
incidents it emits, per evaluate tick, one :class:`CommSummary`: the
communicators that stalled, slowed down or mismatched, who is blocked in them
and where, and the culprits as seen from this group. A culprit that is
itself stuck in another group's communicator is resolved by the job stage
(``job_resolver.JobResolver``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from mycroft.schemas.records import (
    Anomaly,
    BlockedRank,
    BlockState,
    CommStatus,
    CommSummary,
    Culprit,
    Evidence,
    Heartbeat,
    Record,
    StateBatch,
)
from mycroft.schemas.vocab import FaultKind
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import comm_last_progress, lost_ranks
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.rca_hang import explain_hang
from mycroft.streams.core.rca_mismatch import explain_mismatch
from mycroft.streams.core.rca_slow import explain_slowdown

REPORT_FRACTION = 0.5
"""A busy comm is reported once it made no progress for this share of the
shortest hang threshold (``hang_min_s``): the job stage must know where a
rank is stuck before the comms waiting on it fire."""
MAX_CULPRITS = 4
MAX_EVIDENCE = 8
_SENT_IDS = 4096


@dataclass
class _Local:
    """Cached local root cause of one (comm, kind)."""

    computed_ns: int
    frontier: int
    culprits: tuple[Culprit, ...]
    evidence: tuple[Evidence, ...]


class CommAnalyzer:
    """Detection and per-communicator root cause for one (job, comm group).

    Args:
        job_id: The job.
        group: This comm group, ``0 <= group < groups``.
        groups: How many comm groups the job is split into.
        config: Thresholds; defaults to ``DetectorConfig()``.
        refresh_s: Local root causes are recomputed this often per comm
            (and whenever its frontier moves).
    """

    def __init__(
        self,
        job_id: str,
        group: int,
        groups: int,
        config: DetectorConfig | None = None,
        refresh_s: float = 1.0,
    ) -> None:
        if not 0 <= group < groups:
            raise ValueError(f"comm group {group} is outside 0..{groups - 1}")
        self.job_id, self.group, self.groups = job_id, group, groups
        self.inner = Analyzer(job_id, config)
        self.cfg = self.inner.cfg
        self.refresh_ns = int(refresh_s * 1e9)
        self.rows = 0
        self._sent: OrderedDict[str, None] = OrderedDict()
        self._local: dict[tuple[int, FaultKind], _Local] = {}
        self._slow: dict[int, tuple[int, int]] = {}  # comm -> (onset, last seen)

    def ingest(self, record: Record, now_ns: int) -> None:
        """Fold one record of this group in (rows of other groups are not
        expected). Of a heartbeat only its NIC port state is kept: the
        group's state parts carry the host's liveness."""
        if isinstance(record, Heartbeat):
            self.inner.ctx.store.ports.observe(record.host, record.ts_ns, record.nics)
            return
        if isinstance(record, StateBatch):
            self.rows += len(record.rc)
        self.inner.ingest(record, now_ns)

    def evaluate(self, now_ns: int) -> list[CommSummary]:
        """Run the detectors; return this tick's summary (always exactly one)."""
        found = self.inner.detect(now_ns)
        new = [a for a in found if a.anomaly_id not in self._sent]
        for a in new:
            self._sent[a.anomaly_id] = None
        while len(self._sent) > _SENT_IDS:
            self._sent.popitem(last=False)
        statuses = (
            self._hangs(found, now_ns)
            + self._slowdowns(found, now_ns)
            + self._mismatches(found, now_ns)
        )
        summary = CommSummary(
            job_id=self.job_id,
            group=self.group,
            groups=self.groups,
            tick_ns=now_ns,
            data_ns=max(
                (h.last_tick_ns for h in self.inner.ctx.store.hosts.values()), default=0
            ),
            comms_total=self.inner.ctx.store.comm_count(),
            rows=self.rows,
            comms=tuple(statuses),
            anomalies=tuple(new),
            active=tuple(sorted({a.anomaly_id for a in found})),
        )
        self.rows = 0
        return [summary]

    def _hangs(self, found: list[Anomaly], now_ns: int) -> list[CommStatus]:
        ctx = self.inner.ctx
        fired = {c for a in found if a.kind is FaultKind.HANG for c in a.comms}
        report_ns = int(self.cfg.hang_min_s * 1e9 * REPORT_FRACTION)
        stalled = {
            comm: (last, tick - last)
            for comm, (last, tick, busy) in comm_last_progress(ctx.store).items()
            if busy and last > 0 and (tick - last >= report_ns or comm in fired)
        }
        self._forget(FaultKind.HANG, set(stalled))
        if not stalled:
            return []
        lost = lost_ranks(ctx, now_ns)
        s = ctx.store.slots
        ops = ctx.store.in_flight_ops()
        issue = {
            (r, c, q): t
            for r, c, q, t in zip(
                ops["rank"].tolist(),
                ops["comm"].tolist(),
                ops["seq"].tolist(),
                ops["issue_ns"].tolist(),
                strict=True,
            )
        }
        out: list[CommStatus] = []
        for comm, (last, stall) in sorted(stalled.items()):
            m = s["comm"] == comm
            state = {
                int(r): (int(i), int(d))
                for r, i, d in zip(
                    s["rank"][m], s["issued"][m], s["done"][m], strict=True
                )
            }
            members = ctx.topo.members(comm) or tuple(sorted(state))
            frontier = int(s["done"][m].min()) + 1 if m.any() else 0
            blocked = _blocked(comm, members, state, frontier, set(lost), issue)
            local = self._local_hang(comm, frontier, blocked, now_ns)
            out.append(
                CommStatus(
                    comm=comm,
                    kind=FaultKind.HANG,
                    frontier_seq=frontier,
                    last_progress_ns=last,
                    stall_ns=stall,
                    blocked=tuple(blocked),
                    culprits=local.culprits,
                    evidence=local.evidence,
                )
            )
        return out

    def _local_hang(
        self, comm: int, frontier: int, blocked: list[BlockedRank], now_ns: int
    ) -> _Local:
        key = (comm, FaultKind.HANG)
        cached = self._local.get(key)
        if (
            cached is not None
            and cached.frontier == frontier
            and now_ns - cached.computed_ns < self.refresh_ns
        ):
            return cached
        symptom = {b.rank for b in blocked if b.state is BlockState.IN_OP} or {
            b.rank for b in blocked
        }
        culprits, evidence = explain_hang(self.inner.ctx, symptom, now_ns)
        local = _Local(
            now_ns,
            frontier,
            tuple(culprits[:MAX_CULPRITS]),
            tuple(evidence[:MAX_EVIDENCE]),
        )
        self._local[key] = local
        return local

    def _slowdowns(self, found: list[Anomaly], now_ns: int) -> list[CommStatus]:
        for a in found:
            if a.kind is FaultKind.SLOWDOWN:
                for c in a.comms:
                    onset = min(self._slow.get(c, (a.onset_ns, 0))[0], a.onset_ns)
                    self._slow[c] = (onset, now_ns)
        quiet_ns = int(self.cfg.incident_quiet_s * 1e9)
        self._slow = {c: v for c, v in self._slow.items() if now_ns - v[1] <= quiet_ns}
        self._forget(FaultKind.SLOWDOWN, set(self._slow))
        if not self._slow:
            return []
        since = min(onset for onset, _ in self._slow.values())
        first = min(self._slow, key=lambda c: (self._slow[c][0], c))
        key = (first, FaultKind.SLOWDOWN)
        local = self._local.get(key)
        if local is None or now_ns - local.computed_ns >= self.refresh_ns:
            recent = self.inner.stats.since(since)
            culprits, evidence = explain_slowdown(
                self.inner.ctx, recent, since, every_comm=False
            )
            floor = self.inner.ctx.cfg.rca.min_culprit_confidence
            kept = [c for c in culprits if c.confidence >= floor][:MAX_CULPRITS]
            local = self._local[key] = _Local(
                now_ns, 0, tuple(kept), tuple(evidence[:MAX_EVIDENCE])
            )
        return [
            CommStatus(
                comm=c,
                kind=FaultKind.SLOWDOWN,
                frontier_seq=0,
                last_progress_ns=0,
                stall_ns=0,
                culprits=local.culprits if c == first else (),
                evidence=local.evidence if c == first else (),
            )
            for c in sorted(self._slow)
        ]

    def _mismatches(self, found: list[Anomaly], now_ns: int) -> list[CommStatus]:
        by_comm: dict[int, list[Anomaly]] = {}
        for a in found:
            if a.kind is FaultKind.MISMATCH and a.comms:
                by_comm.setdefault(a.comms[0], []).append(a)
        self._forget(FaultKind.MISMATCH, set(by_comm))
        out: list[CommStatus] = []
        for comm, anomalies in sorted(by_comm.items()):
            culprits, evidence = explain_mismatch(self.inner.ctx, anomalies)
            out.append(
                CommStatus(
                    comm=comm,
                    kind=FaultKind.MISMATCH,
                    frontier_seq=0,
                    last_progress_ns=0,
                    stall_ns=0,
                    culprits=tuple(culprits[:MAX_CULPRITS]),
                    evidence=tuple(evidence[:MAX_EVIDENCE]),
                )
            )
        return out

    def _forget(self, kind: FaultKind, keep: set[int]) -> None:
        for key in [k for k in self._local if k[1] is kind and k[0] not in keep]:
            del self._local[key]


def _blocked(  # noqa: PLR0913, PLR0917 - private helper of one module
    comm: int,
    members: tuple[int, ...],
    state: dict[int, tuple[int, int]],
    frontier: int,
    lost: set[int],
    issue: dict[tuple[int, int, int], int],
) -> list[BlockedRank]:
    """Members of a stalled comm that are not idle past its frontier."""
    out: list[BlockedRank] = []
    for r in members:
        issued, done = state.get(r, (-1, -1))
        if r in lost:
            out.append(BlockedRank(r, done + 1, BlockState.LOST))
        elif issued < frontier:
            out.append(BlockedRank(r, frontier, BlockState.ABSENT))
        elif issued > done:
            seq = done + 1
            out.append(
                BlockedRank(r, seq, BlockState.IN_OP, issue.get((r, comm, seq), 0))
            )
    return out


__all__ = ["CommAnalyzer"]
