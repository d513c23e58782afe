"""Incident closure: the tracker publishes it, on event time only."""

from __future__ import annotations

from mycroft.schemas.records import Anomaly, Culprit, Evidence, RootCause
from mycroft.schemas.vocab import Component, FaultKind, IncidentState
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.incidents import Finding, Incident, IncidentTracker
from mycroft.streams.core.snapshot_codec import Part, decode_snapshot, encode_snapshot
from mycroft.streams.core.state_tree import decode_tree, encode_tree
from mycroft.streams.core.topology import JobTopology

S = 1_000_000_000
GPU = Culprit(6, "h1", Component.GPU, FaultKind.HANG, 0.9, reason="stuck")
CFG = DetectorConfig(incident_quiet_s=5.0)


def _anomaly(aid: str, onset_s: float) -> Anomaly:
    onset = int(onset_s * S)
    return Anomaly(aid, "j", FaultKind.HANG, (1,), (6,), onset, onset, "stall", "")


def _explain(
    inc: Incident, kind: FaultKind, now_ns: int
) -> tuple[list[Culprit], list[Evidence]]:
    return [GPU], [Evidence("rank 6 stuck", rank=6)]


def _run(tracker: IncidentTracker, ticks: list[tuple[float, bool]]) -> list[Finding]:
    """Evaluate at each ``(event time s, anomaly firing)``; every finding."""
    out: list[Finding] = []
    for t_s, firing in ticks:
        found = [_anomaly("a", 1.0)] if firing else []
        out += tracker.track(found, int(t_s * S), _explain)
    return out


def _closed(findings: list[Finding]) -> list[RootCause]:
    return [f for f in findings if isinstance(f, RootCause) and f.is_closed]


# firing from 1 s to 3 s, then quiet; evaluated every 0.5 s up to 12 s
TICKS = [(1 + 0.5 * i, i <= 4) for i in range(23)]


def test_closing_resends_the_latest_answer_as_the_next_revision() -> None:
    out = _run(IncidentTracker("j", CFG, JobTopology()), TICKS)
    causes = [f for f in out if isinstance(f, RootCause)]
    assert [c.revision for c in causes] == [0, 1]
    first, closed = causes
    assert first.state is IncidentState.OPEN and first.closed_ns is None
    assert closed.state is IncidentState.CLOSED
    assert closed.incident_id == first.incident_id
    assert (closed.culprits, closed.evidence) == (first.culprits, first.evidence)
    assert closed.resolved_ns == first.resolved_ns  # the answer's own time
    # last anomaly at 3.0 s; the first evaluation more than 5 s later: 8.5 s
    assert closed.closed_ns == int(8.5 * S)
    assert closed.close_reason == "quiet for 5.5 s of event time (incident_quiet_s 5)"


def test_closure_depends_on_event_time_not_on_calls() -> None:
    """The same records give the same closure, however often the tracker is
    evaluated in between with nothing new (a worker idling while it reads)."""
    dense = _run(IncidentTracker("j", CFG, JobTopology()), TICKS)
    repeated = [tick for tick in TICKS for _ in range(3)]
    again = _run(IncidentTracker("j", CFG, JobTopology()), repeated)
    assert _closed(again) == _closed(dense) and len(_closed(dense)) == 1


def test_closure_is_emitted_once() -> None:
    tracker = IncidentTracker("j", CFG, JobTopology())
    out = _run(tracker, TICKS)
    later = _run(tracker, [(20.0, False), (60.0, False)])
    assert len(_closed(out)) == 1 and later == []
    assert tracker.incident is None and len(tracker.closed) == 1
    assert not tracker.closing(tracker.closed[0], 61 * S)  # closed already


def test_no_closure_without_a_published_root_cause() -> None:
    """Anomalies without an answer never reached the root-cause topic: no
    reader has an incident to close."""

    def silent(
        inc: Incident, kind: FaultKind, now_ns: int
    ) -> tuple[list[Culprit], list[Evidence]]:
        return [], []

    tracker = IncidentTracker("j", CFG, JobTopology())
    out = [f for t, on in TICKS for f in tracker.track(
        [_anomaly("a", 1.0)] if on else [], int(t * S), silent
    )]  # fmt: skip
    assert not any(isinstance(f, RootCause) for f in out)
    assert tracker.incident is None and len(tracker.closed) == 1


def _snapshot(tracker: IncidentTracker) -> bytes:
    """The tracker as a snapshot part, its config and topology by reference."""
    refs = {id(CFG): "cfg", id(CFG.rca): "rca", id(tracker.topo): "topology"}
    return encode_snapshot([Part("incidents", 1, encode_tree(tracker, refs))])


def _restore(data: bytes) -> object:
    (sealed,) = decode_snapshot(data)
    refs = {"cfg": CFG, "rca": CFG.rca, "topology": JobTopology()}
    return decode_tree(sealed.open().fields, refs)


def test_a_restored_tracker_emits_the_same_closure() -> None:
    """A snapshot taken while the incident is open keeps what the closure
    needs: the restored tracker closes it as the original does."""
    split = 8  # after the root cause, before the closure
    tracker = IncidentTracker("j", CFG, JobTopology())
    _run(tracker, TICKS[:split])
    data = _snapshot(tracker)
    rest = _run(tracker, TICKS[split:])
    restored = _restore(data)
    assert isinstance(restored, IncidentTracker)
    assert _run(restored, TICKS[split:]) == rest
    assert len(_closed(rest)) == 1


def test_a_snapshot_from_before_closures_restores_and_closes_silently() -> None:
    """An incident restored without its latest revision has nothing to
    resend: it closes as before, without a closed revision."""
    split = 8
    tracker = IncidentTracker("j", CFG, JobTopology())
    _run(tracker, TICKS[:split])
    assert tracker.incident is not None
    tracker.incident.root_cause = None
    restored = _restore(_snapshot(tracker))
    assert isinstance(restored, IncidentTracker)
    assert _closed(_run(restored, TICKS[split:])) == []
    assert restored.incident is None and len(restored.closed) == 1
