"""Incidents: anomalies grouped into one problem, and when its answer changes.

An :class:`IncidentTracker` folds the anomalies firing at each evaluation
into the job's open incident (a new one opens when none is open), closes it
once nothing fired for ``incident_quiet_s`` of event time (a fault after that
opens a new one) and publishes the closure: its latest root cause sent again
as the next revision with state closed (:meth:`IncidentTracker.closing`),
and refreshes its root cause through an :data:`Explainer` handed in:
the single-stage ``Analyzer`` explains from its own flows and collectives,
the two-stage ``JobResolver`` from its comm groups' summaries. Whether a
refreshed answer is published as a new revision is one pure function,
:func:`revise`, of the published :class:`Verdict` and the proposed one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TypeAlias

from mycroft.schemas.records import Anomaly, Culprit, Evidence, RootCause
from mycroft.schemas.text import comm_hex
from mycroft.schemas.vocab import FaultKind, IncidentState
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.culprit_scope import scope_culprits
from mycroft.streams.core.rca_config import DEFAULT_RCA
from mycroft.streams.core.scoring import PEERS
from mycroft.streams.core.topology import JobTopology

Finding: TypeAlias = Anomaly | RootCause
PRIORITY = {FaultKind.MISMATCH: 0, FaultKind.HANG: 1, FaultKind.SLOWDOWN: 2}
"""Kind of an incident whose anomalies differ: the most specific one."""
REEVAL_NS = 1_000_000_000
"""Refresh period of a root cause whose answer changed, or of a hang."""
REEVAL_MAX_NS = 4_000_000_000
"""A slowdown's root cause reads every collective kept since its onset (a
refresh costs 0.7-1.0 CPU s at 1,024 ranks): while its answer holds and no new
anomaly joins, it is refreshed half as often each time, down to this period."""
SIGNATURE_CULPRITS = 3
"""Culprits whose (rank, component, peer, channel) make an answer's identity."""

Key: TypeAlias = tuple[int, object, int | None, int | None]


@dataclass(frozen=True)
class Verdict:
    """One answer of an incident: its kind and culprits, best first."""

    kind: FaultKind
    culprits: tuple[Culprit, ...]

    @property
    def keys(self) -> tuple[Key, ...]:
        """``(rank, component, peer, channel)`` of the culprits that make
        the answer's identity."""
        return tuple(
            (c.rank, c.component, c.peer, c.channel)
            for c in self.culprits[:SIGNATURE_CULPRITS]
        )

    @property
    def top_conf(self) -> float:
        """Confidence of the top culprit (0 for none)."""
        return self.culprits[0].confidence if self.culprits else 0.0

    def same(self, other: Verdict | None) -> bool:
        """Whether ``other`` is the same answer (kind and named culprits)."""
        return other is not None and (other.kind, other.keys) == (self.kind, self.keys)


class Decision(StrEnum):
    """What :func:`revise` makes of a proposed answer."""

    FIRST = "first"
    """Nothing published yet: publish."""
    FIRMED = "firmed"
    """The same answer, published capped, now stands uncapped: publish again."""
    ESCALATED = "escalated"
    """Another kind (a slowdown turned hang): publish."""
    BETTER = "better"
    """Another answer that should replace the published one (:func:`_better`)."""
    PORT_TURN = "port-turn"
    """A port event overturns the published answer: publish."""
    KEEP = "keep"
    """Keep the published answer."""


def revise(
    published: Verdict | None,
    proposed: Verdict,
    *,
    again: bool,
    port_turn: bool = False,
    cap: float = DEFAULT_RCA.hostwide_conf,
) -> Decision:
    """Whether ``proposed`` replaces the ``published`` answer, and why.

    ``again``: the previous round proposed the same answer (published or
    not); ``port_turn``: a port event overturns the published answer (see
    ``Analyzer.port_turn``); ``cap``: the confidence of a capped, revisable
    answer (``RcaConfig.hostwide_conf``).
    """
    if published is None:
        return Decision.FIRST
    if proposed.same(published):
        return Decision.FIRMED if _firmed(proposed, published, cap) else Decision.KEEP
    if proposed.kind != published.kind:
        return Decision.ESCALATED
    if _better(proposed, published, again=again, cap=cap):
        return Decision.BETTER
    return Decision.PORT_TURN if port_turn else Decision.KEEP


def _better(proposed: Verdict, published: Verdict, *, again: bool, cap: float) -> bool:
    """Whether another answer of the same kind should revise the published one.

    A more confident top culprit does. So does another answer when the
    published answer was a capped one (``cap``) whose top culprit (its rank
    with that component) is no longer named at all, and the same answer was
    proposed in the previous round too (``again``): its evidence is gone (an
    early, weak verdict on a few ms of noise, or one formed before the wire
    timing had measured the parts, must not stand for the rest of the
    incident), and not for one round only (a rule whose conditions hold in
    one window flickers). A capped confidence is a bound, not a measure: an
    answer naming both ends of a link splits its share between them and
    stays below it, so a slowdown's new top culprit needs half the published
    one only; below that it is diffuse (small timing suspects sharing what
    nothing explains). A hang is never capped for want of measurements, and
    its new top needs as much. So does a slowdown's published runner-up that
    now leads alone, proposed twice (:func:`_runner_up_alone`). Otherwise an
    uncapped answer is not revised at equal confidence: live, a worker's
    partial view (a lost rank seen alive again after a restore or a
    rebalance) would flip a right answer to a wrong one.
    """
    top = proposed.top_conf
    if top > published.top_conf:
        return True
    if not again:
        return False
    if _runner_up_alone(proposed, published):
        return True
    if published.top_conf > cap or not published.keys:
        return False
    # Named at all: the rank with that component, whatever flow it names.
    named = {(c.rank, c.component) for c in proposed.culprits}
    if published.keys[0][:2] in named:
        return False
    slow = proposed.kind is FaultKind.SLOWDOWN
    return top >= (published.top_conf / PEERS if slow else published.top_conf)


def _runner_up_alone(proposed: Verdict, published: Verdict) -> bool:
    """Whether a slowdown's published runner-up now leads an answer that no
    longer names the published top culprit's rank at all.

    Both ends of the same backlogged flows are named when only they are
    flagged (a sending GPU's proxy and the receiving GPU's PCIe read alike),
    and the first answer leads with one of them. When more flows arrive and
    single out the other end, the first one's evidence is gone; among a
    thousand ranks the new answer's share of the score is diluted by small
    timing suspects, so its confidence alone would never revise the tie.
    """
    if published.kind is not FaultKind.SLOWDOWN or len(published.keys) < PEERS:
        return False
    (old_rank, *_), (up_rank, up_comp, *_) = published.keys[:PEERS]
    new = proposed.culprits[0]
    return (new.rank, new.component) == (up_rank, up_comp) and all(
        c.rank != old_rank for c in proposed.culprits
    )


def _firmed(proposed: Verdict, published: Verdict, cap: float) -> bool:
    """Whether the same answer, published capped (``cap``), now
    stands uncapped: it is published again, so that readers see it confirmed
    and a later answer needs more than the cap to revise it."""
    return published.top_conf <= cap < proposed.top_conf


def next_period(period_ns: int, kind: FaultKind, *, again: bool) -> int:
    """The next refresh period of an incident's root cause.

    A slowdown's answer that held (``again``) is refreshed half as often,
    down to ``REEVAL_MAX_NS``; a changed answer, and every hang or mismatch
    (cheap, and revised by events such as a port going down), every
    ``REEVAL_NS``.
    """
    if kind is FaultKind.SLOWDOWN and again:
        return min(2 * period_ns, REEVAL_MAX_NS)
    return REEVAL_NS


@dataclass
class Incident:
    """One ongoing problem: its anomalies and the answers given for it."""

    incident_id: str
    kind: FaultKind
    onset_ns: int
    detected_ns: int
    anomalies: dict[str, Anomaly] = field(default_factory=dict)
    last_active_ns: int = 0
    last_rca_ns: int = 0
    revision: int = -1
    published: Verdict | None = None
    proposed: Verdict | None = None  # the last round's answer, published or not
    rca_period_ns: int = REEVAL_NS  # see next_period
    root_cause: RootCause | None = None  # the latest revision published

    @property
    def since_ns(self) -> int:
        """Earliest onset among the incident's anomalies."""
        return min(a.onset_ns for a in self.anomalies.values())


Explainer = Callable[[Incident, FaultKind, int], tuple[list[Culprit], list[Evidence]]]
"""``(incident, kind, now_ns) -> (culprits best first, evidence)``; no
culprits: no answer this round (retried at the next refresh). The tracker
drops a slowdown's culprits below ``RcaConfig.min_culprit_confidence``."""
PortTurn = Callable[[list[Culprit], Incident], bool]
"""Whether a port event overturns the incident's published answer."""


def _never(_: list[Culprit], __: Incident) -> bool:
    return False


class IncidentTracker:
    """The job's open incident, the closed ones, and what was emitted.

    Args:
        job_id: The job.
        config: ``incident_quiet_s`` and ``incident_max_anomalies`` are read.
        topo: The job's topology (culprits are scoped with it).
    """

    def __init__(self, job_id: str, config: DetectorConfig, topo: JobTopology) -> None:
        self.job_id, self.cfg, self.topo = job_id, config, topo
        self.incident: Incident | None = None
        self.closed: list[Incident] = []
        self.emitted: set[str] = set()

    def track(
        self,
        found: list[Anomaly],
        now_ns: int,
        explain: Explainer,
        port_turn: PortTurn = _never,
        *,
        refresh: bool = False,
    ) -> list[Finding]:
        """Fold the anomalies firing now into the incident; return what is new
        (anomalies first, each id once; then a root-cause revision, if any).

        ``refresh``: explain the open incident now, whatever its refresh
        period (the explainer has evidence its last answer lacked)."""
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
            self.incident = None
            out.extend(self.closing(inc, now_ns))
        for a in found:
            if a.anomaly_id in self.emitted or not self._novel(a):
                continue
            self.emitted.add(a.anomaly_id)
            if self.incident is None:
                self.incident = Incident(
                    _incident_id(a), a.kind, a.onset_ns, now_ns, last_active_ns=now_ns
                )
            self.incident.anomalies[a.anomaly_id] = a
            self.incident.rca_period_ns = REEVAL_NS
            if len(self.incident.anomalies) <= self.cfg.incident_max_anomalies:
                out.append(a)
        rc = self._resolve(now_ns, explain, port_turn, refresh=refresh)
        return out + ([rc] if rc is not None else [])

    def closing(self, inc: Incident, now_ns: int) -> list[RootCause]:
        """The revision that closes ``inc`` at event time ``now_ns``: its
        latest root cause again, next revision, state closed; none when no
        root cause was published for it or it is closed already.

        Everything in it comes from the records (the incident's last anomaly
        and ``now_ns``), so a replay closes at the same revision and time.
        """
        rc = inc.root_cause
        if rc is None or rc.is_closed:
            return []
        quiet_s = (now_ns - inc.last_active_ns) / 1e9
        inc.revision += 1
        inc.root_cause = replace(
            rc,
            revision=inc.revision,
            state=IncidentState.CLOSED,
            closed_ns=now_ns,
            close_reason=f"quiet for {quiet_s:.1f} s of event time "
            f"(incident_quiet_s {self.cfg.incident_quiet_s:g})",
        )
        return [inc.root_cause]

    def _novel(self, a: Anomaly) -> bool:
        inc = self.incident
        if inc is None:
            return True
        return not any(
            o.detector == a.detector and o.comms == a.comms and o.ranks == a.ranks
            for o in inc.anomalies.values()
        )

    def _resolve(
        self, now_ns: int, explain: Explainer, port_turn: PortTurn, *, refresh: bool
    ) -> RootCause | None:
        inc = self.incident
        if inc is None or not inc.anomalies:
            return None
        due = now_ns - inc.last_rca_ns >= inc.rca_period_ns
        if inc.revision >= 0 and not due and not refresh:
            return None
        inc.last_rca_ns = now_ns
        kind = min((a.kind for a in inc.anomalies.values()), key=PRIORITY.__getitem__)
        culprits, evidence = explain(inc, kind, now_ns)
        rca = self.cfg.rca
        if kind is FaultKind.SLOWDOWN:
            # Every large job has small timing suspects (a rank a few ms late
            # in one group): a slowdown's answer names only culprits above
            # the floor. Culprits come best first, so this drops a tail.
            floor = rca.min_culprit_confidence
            culprits = [c for c in culprits if c.confidence >= floor]
        if not culprits:
            return None
        proposed = Verdict(kind, tuple(culprits))
        again = proposed.same(inc.proposed)
        inc.proposed = proposed
        inc.rca_period_ns = next_period(inc.rca_period_ns, kind, again=again)
        published = inc.published
        turn = (
            published is not None
            and not proposed.same(published)
            and port_turn(culprits, inc)
        )
        decision = revise(
            published, proposed, again=again, port_turn=turn, cap=rca.hostwide_conf
        )
        if decision is Decision.KEEP:
            return None
        inc.published, inc.kind, inc.revision = proposed, kind, inc.revision + 1
        inc.root_cause = RootCause(
            incident_id=inc.incident_id,
            revision=inc.revision,
            job_id=self.job_id,
            kind=kind,
            culprits=tuple(scope_culprits(culprits, self.topo, rca.max_confidence)),
            evidence=tuple(evidence[:24]),
            anomaly_ids=tuple(
                sorted(list(inc.anomalies)[: self.cfg.incident_max_anomalies])
            ),
            onset_ns=inc.since_ns,
            detected_ns=inc.detected_ns,
            resolved_ns=now_ns,
        )
        return inc.root_cause


def _incident_id(a: Anomaly) -> str:
    comm = comm_hex(a.comms[0]) if a.comms else "job"
    return f"{a.job_id}:{a.kind.value}:{comm}:{a.onset_ns}"


__all__ = [
    "Decision",
    "Explainer",
    "Finding",
    "Incident",
    "IncidentTracker",
    "Verdict",
    "next_period",
    "revise",
]
