"""Incidents: when an answer is published again, and how incidents open and close."""

from __future__ import annotations

from dataclasses import replace

from mycroft.schemas.records import Anomaly, Culprit, Evidence, RootCause
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.incidents import (
    Decision,
    Incident,
    IncidentTracker,
    Verdict,
    revise,
)
from mycroft.streams.core.topology import JobTopology

S = 1_000_000_000
GPU = Culprit(6, "h1", Component.GPU, FaultKind.SLOWDOWN, 0.6)
NIC = Culprit(9, "h2", Component.NIC, FaultKind.SLOWDOWN, 0.9, 10, 0)


def _slow(*culprits: Culprit) -> Verdict:
    return Verdict(FaultKind.SLOWDOWN, culprits)


def test_revise_says_why_an_answer_is_published() -> None:
    assert revise(None, _slow(GPU), again=False) is Decision.FIRST
    assert revise(_slow(GPU), _slow(GPU), again=True) is Decision.KEEP
    firm = replace(GPU, confidence=0.99)
    assert revise(_slow(GPU), _slow(firm), again=True) is Decision.FIRMED
    hang = Verdict(FaultKind.HANG, (replace(GPU, kind=FaultKind.HANG),))
    assert revise(_slow(GPU), hang, again=False) is Decision.ESCALATED
    assert revise(_slow(GPU), _slow(NIC), again=False) is Decision.BETTER
    weak = replace(NIC, confidence=0.5)
    assert revise(_slow(firm), _slow(weak), again=True) is Decision.KEEP
    turned = revise(_slow(firm), _slow(weak), again=True, port_turn=True)
    assert turned is Decision.PORT_TURN
    # the port turn never applies to the same answer
    assert revise(_slow(firm), _slow(firm), again=True, port_turn=True) is (
        Decision.KEEP
    )


def test_a_capped_answer_whose_culprit_is_gone_is_revised_at_any_confidence() -> None:
    """A capped answer (0.6) is a bound, not a measure: once two rounds in a
    row name another culprit and not it at all, the new answer replaces it,
    even split between a link's two ends below the cap."""
    both_ends = _slow(
        replace(NIC, confidence=0.4), replace(NIC, rank=2, confidence=0.35)
    )
    assert revise(_slow(GPU), both_ends, again=True) is Decision.BETTER
    assert revise(_slow(GPU), both_ends, again=False) is Decision.KEEP  # once
    still_named = _slow(replace(NIC, confidence=0.4), replace(GPU, confidence=0.3))
    assert revise(_slow(GPU), still_named, again=True) is Decision.KEEP
    firm = replace(GPU, confidence=0.99)  # not capped: not revised below it
    assert revise(_slow(firm), both_ends, again=True) is Decision.KEEP


def _anomaly(aid: str, onset_s: float) -> Anomaly:
    onset = int(onset_s * S)
    return Anomaly(aid, "j", FaultKind.SLOWDOWN, (1,), (6,), onset, onset, "late", "")


def test_an_incident_closes_when_its_symptoms_end_and_a_later_fault_opens_another() -> (
    None
):
    cfg = DetectorConfig()
    tracker = IncidentTracker("j", cfg, JobTopology())
    answers = {"first": [GPU], "second": [NIC]}
    which = {"now": "first"}

    def explain(
        inc: Incident, kind: FaultKind, now_ns: int
    ) -> tuple[list[Culprit], list[Evidence]]:
        return answers[which["now"]], []

    quiet = cfg.incident_quiet_s
    out = tracker.track([_anomaly("a", 1.0)], 1 * S, explain)
    assert [type(f).__name__ for f in out] == ["Anomaly", "RootCause"]
    first = tracker.incident
    assert first is not None
    # still firing: the same incident, no new anomaly emitted for a repeat
    assert tracker.track([_anomaly("a", 1.0)], 2 * S, explain) == []
    # quiet for less than incident_quiet_s: still open
    tracker.track([], int((2 + quiet / 2) * S), explain)
    assert tracker.incident is first
    # quiet for longer: closed
    tracker.track([], int((3 + quiet) * S), explain)
    assert tracker.incident is None and tracker.closed == [first]
    which["now"] = "second"
    t = int((5 + quiet) * S)
    out = tracker.track([_anomaly("b", 5 + quiet)], t, explain)
    causes = [f for f in out if isinstance(f, RootCause)]
    assert len(causes) == 1 and causes[0].incident_id != first.incident_id
    assert causes[0].revision == 0 and causes[0].culprits[0].rank == NIC.rank


def test_a_slowdown_names_only_culprits_above_the_floor() -> None:
    cfg = DetectorConfig()
    floor = cfg.rca.min_culprit_confidence
    faint = replace(NIC, rank=12, confidence=floor / 2)
    answer = {"culprits": [GPU, faint]}

    def explain(
        inc: Incident, kind: FaultKind, now_ns: int
    ) -> tuple[list[Culprit], list[Evidence]]:
        return answer["culprits"], []

    tracker = IncidentTracker("j", cfg, JobTopology())
    out = tracker.track([_anomaly("a", 1.0)], 1 * S, explain)
    (cause,) = [f for f in out if isinstance(f, RootCause)]
    assert [c.rank for c in cause.culprits] == [GPU.rank]
    # nothing above the floor: no answer at all
    answer["culprits"] = [faint]
    tracker = IncidentTracker("j", cfg, JobTopology())
    out = tracker.track([_anomaly("a", 1.0)], 1 * S, explain)
    assert not [f for f in out if isinstance(f, RootCause)]
