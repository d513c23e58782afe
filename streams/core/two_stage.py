"""The two-stage pipeline in one process: split, per-group analysis, job resolution.

``TwoStageReplay`` drives stages 0-2 of ``streams/SCALING.md`` on recorded or
simulated records, with trace time as ``now`` like ``mycroft.streams.analyze.
Replay``: tests and benchmarks compare it with the single-stage analyzer
without a broker. The Faust stages (``mycroft streams worker --stage ...``)
run the same three objects.
"""

from __future__ import annotations

from mycroft.schemas.records import (
    Anomaly,
    CommSummary,
    CompletionBatch,
    Heartbeat,
    Record,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.streams.core.comm_analyzer import CommAnalyzer
from mycroft.streams.core.comm_split import split_by_comm
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.job_resolver import JobResolver

_CADENCE_NS = 100_000_000


class TwoStageReplay:
    """Feed ``(ts_ns, record)`` pairs of one job through all three stages.

    As in the Faust split stage, heartbeats reach every group only for their
    NIC port state (every group gets a part of every state batch, which
    carries the host's liveness).

    Args:
        job_id: The job (records of other jobs are ignored).
        groups: Comm groups (stage-1 engines).
        config: Thresholds shared by every stage.
        cadence_ns: Evaluate period of stages 1 and 2, trace time.
    """

    def __init__(
        self,
        job_id: str,
        groups: int,
        config: DetectorConfig | None = None,
        cadence_ns: int = _CADENCE_NS,
    ) -> None:
        self.job_id = job_id
        self.groups = [CommAnalyzer(job_id, g, groups, config) for g in range(groups)]
        self.resolver = JobResolver(job_id, config)
        self.cadence_ns = cadence_ns
        self.anomalies: list[Anomaly] = []
        self.causes: dict[str, RootCause] = {}
        self.revisions: list[RootCause] = []
        self.summaries = 0
        self._next = -1

    def feed(self, ts_ns: int, record: Record) -> None:
        """Ingest one record at trace time ``ts_ns`` (evaluating on the way)."""
        if self._next < 0:
            self._next = ts_ns
        while self._next <= ts_ns:
            self.tick(self._next)
            self._next += self.cadence_ns
        if isinstance(record, StateBatch | CompletionBatch):
            if record.header.job_id != self.job_id:
                return
            for g, part in split_by_comm(record, len(self.groups)).items():
                self.groups[g].ingest(part, ts_ns)
        elif isinstance(record, Topology) and record.job_id == self.job_id:
            for stage1 in self.groups:
                stage1.ingest(record, ts_ns)
            self.resolver.ingest(record, ts_ns)
        elif isinstance(record, Heartbeat) and record.job_id == self.job_id:
            if record.nics:
                for stage1 in self.groups:
                    stage1.ingest(record, ts_ns)

    def tick(self, now_ns: int) -> list[CommSummary]:
        """Evaluate every group, hand the summaries to stage 2, evaluate it."""
        summaries = [s for stage1 in self.groups for s in stage1.evaluate(now_ns)]
        for s in summaries:
            self.resolver.ingest(s, now_ns)
        self.summaries += len(summaries)
        for f in self.resolver.evaluate(now_ns):
            if isinstance(f, RootCause):
                self.causes[f.incident_id] = f
                self.revisions.append(f)
            else:
                self.anomalies.append(f)
        return summaries

    def write(self, record: Record, ts_ns: int) -> None:
        """``RecordWriter`` protocol: lets a simulator write straight in."""
        self.feed(ts_ns, record)

    def close(self) -> None:
        """``RecordWriter`` protocol: run the final evaluation."""
        if self._next >= 0:
            self.tick(self._next)


__all__ = ["TwoStageReplay"]
