"""Incidents assembled from the root-cause and anomaly topics.

A root cause is one revision of an incident; later revisions replace earlier
ones. :class:`IncidentBook` keeps every revision of every incident (a
re-delivered revision is ignored), the anomalies each one cites, and the
topology of each job, so ``mycroft incidents`` can list incidents, print one
whole and tell a new incident from a revision while following.

An incident is *open* until its closed revision arrives: the stream worker
sends the latest answer again with state closed once nothing fired for
``incident_quiet_s`` of event time (RootCause.4 on). Records of a writer
from before that never close, so those incidents count as open while their
latest revision is younger than the TTL (600 s, as the sinks'
``--incident-ttl``), judged by when the worker emitted it, or by its
resolution time for records without that stamp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from mycroft.schemas.records import Anomaly, RankTopology, Record, RootCause, Topology

DEFAULT_TTL_S = 600.0


class Change(Enum):
    """What one record did to the book."""

    NEW = "new"
    REVISED = "revised"
    ANOMALY = "anomaly"
    IGNORED = "ignored"
    CLOSED = "closed"


@dataclass
class Incident:
    """Every revision of one incident, oldest first."""

    revisions: list[RootCause]

    @property
    def latest(self) -> RootCause:
        """The revision in force."""
        return self.revisions[-1]

    @property
    def incident_id(self) -> str:
        return self.latest.incident_id

    @property
    def last_seen_ns(self) -> int:
        """When the latest revision was emitted (its resolution time if unstamped)."""
        rc = self.latest
        return rc.emitted_wall_ns or rc.resolved_ns

    @property
    def closed(self) -> RootCause | None:
        """The revision that closed the incident; None while open."""
        return self.latest if self.latest.is_closed else None

    def is_open(self, now_ns: int, ttl_s: float = DEFAULT_TTL_S) -> bool:
        """Whether no closed revision came; for a writer that never sends
        one (RootCause.1-3), whether a revision came within ``ttl_s``."""
        if self.latest.is_closed:
            return False
        if self.latest.states_closure:
            return True
        return now_ns - self.last_seen_ns < ttl_s * 1e9


@dataclass
class IncidentBook:
    """Incidents by id, with anomalies by id and rank placements by job."""

    incidents: dict[str, Incident] = field(default_factory=dict)
    anomalies: dict[str, Anomaly] = field(default_factory=dict)
    placements: dict[str, dict[int, tuple[str, RankTopology]]] = field(
        default_factory=dict
    )

    def add(self, record: Record) -> Change:
        """Take one record from the topics; say what it changed."""
        if isinstance(record, Anomaly):
            if record.anomaly_id in self.anomalies:
                return Change.IGNORED
            self.anomalies[record.anomaly_id] = record
            return Change.ANOMALY
        if isinstance(record, Topology):
            job = self.placements.setdefault(record.job_id, {})
            job.update({r.rank: (record.host, r) for r in record.ranks})
            return Change.IGNORED
        if isinstance(record, RootCause):
            return self._add_root_cause(record)
        return Change.IGNORED

    def _add_root_cause(self, record: RootCause) -> Change:
        inc = self.incidents.get(record.incident_id)
        if inc is None:
            self.incidents[record.incident_id] = Incident([record])
        elif any(r.revision == record.revision for r in inc.revisions):
            return Change.IGNORED
        else:
            inc.revisions.append(record)
            inc.revisions.sort(key=lambda r: r.revision)
        if record.is_closed:
            return Change.CLOSED
        return Change.NEW if inc is None else Change.REVISED

    def cited(self, inc: Incident) -> list[Anomaly]:
        """The anomalies any revision of ``inc`` cites, that the book has seen."""
        ids = dict.fromkeys(a for rc in inc.revisions for a in rc.anomaly_ids)
        return [self.anomalies[a] for a in ids if a in self.anomalies]

    def placement(self, job_id: str, rank: int) -> tuple[str, RankTopology] | None:
        """``(host, rank topology)`` of a job's rank, when its topology was read."""
        return self.placements.get(job_id, {}).get(rank)

    def select(
        self,
        *,
        job_id: str | None = None,
        now_ns: int,
        since_s: float | None = None,
        open_only: bool = False,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> list[Incident]:
        """Incidents of ``job_id`` (all jobs: None), oldest detection first.

        ``since_s`` keeps those revised in the last ``since_s`` seconds and
        every open one; ``open_only`` keeps the open ones only.
        """
        out = []
        for inc in self.incidents.values():
            if job_id is not None and inc.latest.job_id != job_id:
                continue
            is_open = inc.is_open(now_ns, ttl_s)
            if open_only and not is_open:
                continue
            recent = since_s is None or now_ns - inc.last_seen_ns < since_s * 1e9
            if is_open or recent:
                out.append(inc)
        return sorted(out, key=lambda i: (i.latest.detected_ns, i.incident_id))

    def find(self, key: str) -> list[Incident]:
        """Incidents whose id is ``key``, or whose short id
        (:func:`mycroft.verdict.short_id`) it is, or else whose id contains it."""
        from mycroft.verdict import short_id  # noqa: PLC0415

        if key in self.incidents:
            return [self.incidents[key]]
        short = [inc for iid, inc in self.incidents.items() if short_id(iid) == key]
        return short or [inc for iid, inc in self.incidents.items() if key in iid]
