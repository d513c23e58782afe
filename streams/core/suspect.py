"""Suspects: what the rules observed against each rank, ranked into culprits.

A ``Suspect`` sums, per component, the scores its rules add (weights from
``scoring.WEIGHTS``, as ``RcaConfig`` sets them) and keeps each
``Observation``; ``Suspects`` holds one root cause's suspects and its
``RcaConfig``; ``rank_suspects`` turns them into culprits, best first, each
carrying the rules behind it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mycroft.schemas.records import Culprit
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.core.evidence import Observation, Rule
from mycroft.streams.core.rca_config import DEFAULT_RCA, RcaConfig
from mycroft.streams.core.scoring import DIRECT_RULES, FLOW_RULES, WEIGHTS
from mycroft.streams.core.topology import JobTopology

FLOW_COMPONENTS = (Component.NIC, Component.NETWORK, Component.PROXY)
"""Components whose culprit names the suspect's flow."""


@dataclass
class Suspect:
    """Accumulated evidence against one rank, scored by ``rca``."""

    rank: int
    rca: RcaConfig = field(default=DEFAULT_RCA, repr=False, compare=False)
    scores: dict[Component, float] = field(default_factory=dict)
    flow: tuple[int, int] | None = None  # (peer, channel)
    reasons: list[str] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)

    def add(
        self,
        rule: Rule,
        reason: str,
        *,
        score: float | None = None,
        component: Component | None = None,
        flow: tuple[int, int] | None = None,
    ) -> None:
        """Add ``rule``'s weight (or ``score``, computed by its formula) to
        its component (or ``component``), with a human reason."""
        comp = WEIGHTS[rule].component if component is None else component
        if comp is None:
            raise ValueError(f"rule {rule} needs the component it adds to")
        value = self.rca.weight(rule) if score is None else score
        self.scores[comp] = self.scores.get(comp, 0.0) + value
        self.reasons.append(reason)
        self.observations.append(self._observe(rule, comp, value, reason, flow))

    def consider(self, comp: Component) -> None:
        """Make ``comp`` a candidate component (score 0) if it is not one."""
        self.scores.setdefault(comp, 0.0)

    def fold(self, rule: Rule, comps: Sequence[Component], reason: str) -> None:
        """Move the scores of ``comps`` onto ``rule``'s component plus its
        weight; the reason is stated first."""
        comp = WEIGHTS[rule].component
        if comp is None:
            raise ValueError(f"rule {rule} has no component to fold into")
        folded = sum(self.scores.pop(c, 0.0) for c in comps)
        value = self.rca.weight(rule)
        self.scores[comp] = folded + value
        self.reasons.insert(0, reason)
        self.observations.insert(0, self._observe(rule, comp, value, reason))

    def scale(
        self,
        rule: Rule,
        comps: Sequence[Component],
        reason: str,
        factor: float | None = None,
    ) -> None:
        """Multiply the scores of ``comps`` by ``factor`` (default:
        ``rule``'s weight)."""
        by = self.rca.weight(rule) if factor is None else factor
        for c in comps:
            if c in self.scores:
                self.scores[c] *= by
        self.reasons.append(reason)
        self.observations.append(self._observe(rule, None, by, reason))

    def take(self, other: Suspect, comps: Sequence[Component]) -> None:
        """Take ``other``'s scores of ``comps`` and the observations behind them
        (and its first reason): the two ranks are one part."""
        for c in comps:
            if c in other.scores:
                self.scores[c] = self.scores.get(c, 0.0) + other.scores.pop(c)
        self.reasons.extend(other.reasons[:1])
        moved = [o for o in other.observations if o.component in comps]
        other.observations = [o for o in other.observations if o not in moved]
        self.observations.extend(moved)

    @property
    def best(self) -> tuple[Component, float]:
        """Return the highest-scored component and its score."""
        comp = max(self.scores, key=lambda c: self.scores[c])
        return comp, self.scores[comp]

    @property
    def rules(self) -> tuple[str, ...]:
        """Names of the rules that scored this rank, in the order they did."""
        return tuple(dict.fromkeys(o.rule.value for o in self.observations))

    def _observe(
        self,
        rule: Rule,
        comp: Component | None,
        score: float,
        reason: str,
        flow: tuple[int, int] | None = None,
    ) -> Observation:
        subject = WEIGHTS[rule].subject
        return Observation(rule, subject, self.rank, comp, score, reason, flow)


class Suspects(dict[int, Suspect]):
    """One root cause's suspects by rank, and the scoring they share."""

    def __init__(self, rca: RcaConfig, items: Mapping[int, Suspect] | None = None):
        super().__init__(items or {})
        self.rca = rca

    def at(self, rank: int) -> Suspect:
        """The suspect ``rank``, added (with no score) when new."""
        sus = self.get(rank)
        if sus is None:
            sus = self[rank] = Suspect(rank, self.rca)
        return sus


def explain_away(suspects: Suspects) -> None:
    """Shrink the flow-gap scores of suspects that direct evidence explains.

    When some suspect holds direct evidence (``scoring.DIRECT_RULES``: its
    port went down, its own compute slowed), flow gaps elsewhere are most
    likely its consequence: the components other suspects scored from flow
    rules only keep, together, at most ``EXPLAINED_AWAY``'s share of the best
    such cause's score (each in proportion to its own). They stay named, as
    symptoms, below their cause; without this a backlog spread over a whole
    job scores by its flow count and outweighs the one measurement taken at
    the faulty part.
    """
    causes = [s for s in suspects.values() if s.scores and _ruled(s, DIRECT_RULES)]
    if not causes:
        return
    top = max(causes, key=lambda s: (s.best[1], -s.rank))
    cause_ranks = {s.rank for s in causes}
    explained: dict[int, list[Component]] = {}
    for sus in suspects.values():
        if sus.rank in cause_ranks:
            continue
        flow = {o.component for o in sus.observations if o.rule in FLOW_RULES}
        other = {o.component for o in sus.observations if o.rule not in FLOW_RULES}
        comps = [c for c in flow - other if c is not None and c in sus.scores]
        if comps:
            explained[sus.rank] = comps
    total = sum(suspects[r].scores[c] for r, cs in explained.items() for c in cs)
    most = suspects.rca.weight(Rule.EXPLAINED_AWAY) * top.best[1]
    if total <= most:
        return
    why = (
        f"flow gaps explained by rank {top.rank}'s {top.best[0].value} "
        "(measured there: a port down, its own compute or its wire time)"
    )
    for r, comps in explained.items():
        suspects[r].scale(Rule.EXPLAINED_AWAY, comps, why, most / total)


def _ruled(sus: Suspect, rules: frozenset[Rule]) -> bool:
    return any(o.rule in rules for o in sus.observations)


def rank_suspects(
    topo: JobTopology, suspects: Suspects, kind: FaultKind
) -> list[Culprit]:
    """Return the culprits of ``suspects``, best first, at most
    ``max_culprits``: each suspect's best component, its confidence that
    score's share of all suspects' best scores (at most ``max_confidence``).
    Only suspects with a positive best score are named, unless none has one."""
    scored = [(sus.best, sus) for sus in suspects.values() if sus.scores]
    scored = [x for x in scored if x[0][1] > 0] or scored
    total = sum(max(sc, 0.0) for (_, sc), _ in scored) or 1.0
    scored.sort(key=lambda x: (-x[0][1], x[1].rank))
    rca = suspects.rca
    out: list[Culprit] = []
    for (comp, sc), sus in scored[: rca.max_culprits]:
        with_flow = comp in FLOW_COMPONENTS
        peer, ch = sus.flow if (sus.flow and with_flow) else (None, None)
        out.append(
            Culprit(
                rank=sus.rank,
                host=topo.host_of(sus.rank),
                component=comp,
                kind=kind,
                confidence=round(min(rca.max_confidence, max(sc, 0.0) / total), 3),
                peer=peer,
                channel=ch,
                reason="; ".join(sus.reasons[: rca.reasons_shown]),
                rules=sus.rules,
            )
        )
    return out
