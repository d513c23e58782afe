"""The headline every command leads with: what, where, how sure, what next."""

from __future__ import annotations

from dataclasses import replace
from html import escape

import pytest

from mycroft.incident_book import IncidentBook
from mycroft.report.page import answer
from mycroft.schemas.records import Culprit, Evidence, RootCause
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.verdict import (
    CONFIDENCE_NOTE,
    NEXT_STEP,
    Place,
    certainty,
    folded,
    headline,
    next_step,
    short_id,
    unique,
    verdict_lines,
)

S = 1_000_000_000
PLACES = {5: Place("node-1", "gpu1", "mlx5_1"), 9: Place("node-2", "gpu1", "mlx5_3")}


def _rc(culprit: Culprit, *facts: str) -> RootCause:
    return RootCause(
        "job-a:hang:0x0bdef175e79f5775:1767225603006094699", 0, "job-a",
        FaultKind.HANG, (culprit,), tuple(Evidence(f) for f in facts), ("a1",),
        10 * S, 12 * S, 13 * S,
    )  # fmt: skip


def _culprit(component: Component, confidence: float = 0.62, **kw: object) -> Culprit:
    return Culprit(5, "node-1", component, FaultKind.HANG, confidence, **kw)


@pytest.mark.parametrize(
    ("confidence", "words"),
    [(0.99, "almost certain"), (0.85, "almost certain"), (0.84, "likely"),
     (0.6, "likely"), (0.59, "possible"), (0.1, "possible")],
)  # fmt: skip
def test_confidence_in_words(confidence: float, words: str) -> None:
    assert certainty(confidence) == words


def test_a_rank_headline_names_the_rank_its_gpu_and_host() -> None:
    rc = _rc(_culprit(Component.GPU))
    assert headline(rc, PLACES.get) == (
        "hang at rank 5 (GPU gpu1) on host node-1: the GPU, likely (0.62)"
    )
    assert headline(rc) == "hang at rank 5 on host node-1: the GPU, likely (0.62)"


def test_a_host_wide_culprit_still_names_its_rank() -> None:
    """The core may blame a whole host for one rank's stall; the headline
    keeps the rank it started from in front."""
    c = _culprit(Component.HOST, 0.99, scope="host", ranks=(4, 5, 6, 7))
    assert headline(_rc(c), PLACES.get) == (
        "hang at rank 5 (GPU gpu1) on host node-1, blamed for the whole host "
        "(ranks 4-7): the host, almost certain (0.99)"
    )


def test_a_nic_and_a_link_headline() -> None:
    nic = _culprit(Component.NIC, 0.91, scope="nic", device="mlx5_1", ranks=(4, 5))
    assert headline(_rc(nic), PLACES.get) == (
        "hang at NIC mlx5_1 of host node-1 (ranks 4, 5): the NIC, almost certain (0.91)"
    )
    link = _culprit(Component.NETWORK, 0.5, scope="link", peer=9, channel=2)
    assert headline(_rc(link), PLACES.get) == (
        "hang at link 5 -> 9, channel 2 (node-1 -> node-2): the network, "
        "possible (0.50)"
    )


def test_every_component_has_a_next_step_filled_in() -> None:
    assert set(NEXT_STEP) == set(Component)
    for component in Component:
        step = next_step(_culprit(component, peer=9), PLACES.get)
        assert "{" not in step and step, component
    assert next_step(_culprit(Component.GPU), PLACES.get).startswith(
        "drain node-1 and run the GPU diagnostics on gpu1 (dcgmi diag"
    )
    nic = _culprit(Component.NIC, scope="nic", device="mlx5_1", ranks=(4, 5))
    assert "check NIC mlx5_1 on node-1: port link state and error counters" in (
        next_step(nic, PLACES.get)
    )
    assert "collective-order or size bug" in next_step(_culprit(Component.CONFIG))
    assert "node-1 -> node-2" in next_step(
        _culprit(Component.NETWORK, peer=9), PLACES.get
    )


def test_evidence_lines_are_printed_once() -> None:
    rc = _rc(_culprit(Component.GPU), "a waits on b", "b froze", "a waits on b", "c")
    lines = verdict_lines(rc)
    assert lines[0].startswith("hang at rank 5")
    assert lines[1].startswith("  next step: drain node-1")
    assert [ln for ln in lines if ln.startswith("    - ")] == [
        "    - a waits on b", "    - b froze", "    - c",
    ]  # fmt: skip
    assert unique(["x", "y", "x"]) == ["x", "y"]


def test_anomalies_fold_to_a_count_unless_verbose() -> None:
    rows = [f"  a{i}" for i in range(10)]
    assert folded(rows) == ["  a0", "  a1", "  a2", "  ... and 7 more (--verbose: all)"]
    assert folded(rows, verbose=True) == rows
    assert folded(rows[:4]) == rows[:4]


def test_the_short_id_finds_its_incident() -> None:
    rc = _rc(_culprit(Component.GPU))
    book = IncidentBook()
    book.add(rc)
    book.add(replace(rc, incident_id="job-b:hang:0x1:2"))
    sid = short_id(rc.incident_id)
    assert len(sid) == 8 and sid != short_id("job-b:hang:0x1:2")
    assert [i.latest.incident_id for i in book.find(sid)] == [rc.incident_id]


def test_the_report_leads_with_the_answer_and_explains_the_confidence() -> None:
    html = answer(_rc(_culprit(Component.GPU)), PLACES.get)
    assert html.index("hang at rank 5 (GPU gpu1) on host node-1") < html.index(
        "Next step:"
    )
    assert escape(CONFIDENCE_NOTE) in html
