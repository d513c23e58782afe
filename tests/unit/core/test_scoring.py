"""The scoring model: one weight per rule, documented, and culprits that
carry the rules behind them."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.core.evidence import Rule, Subject
from mycroft.streams.core.rca_config import DEFAULT_RCA, RcaConfig
from mycroft.streams.core.scoring import WEIGHTS
from mycroft.streams.core.suspect import (
    Suspect,
    Suspects,
    explain_away,
    rank_suspects,
)
from mycroft.streams.core.topology import JobTopology

README = Path(__file__).resolve().parents[3] / "streams" / "core" / "README.md"
ROW = re.compile(r"^\| `([a-z_]+)` \| ([a-z-]+) \| ([0-9.]+) \| ([a-z]+) \| (.+) \|$")


def _readme_rows() -> dict[str, tuple[str, float, str, str]]:
    rows: dict[str, tuple[str, float, str, str]] = {}
    for line in README.read_text().splitlines():
        if m := ROW.match(line):
            rule, comp, w, subject, why = m.groups()
            rows[rule] = (comp, float(w), subject, why)
    return rows


def test_every_rule_has_one_weight():
    assert set(WEIGHTS) == set(Rule)
    assert all(w.weight > 0 for w in WEIGHTS.values())


def test_readme_lists_every_rule_with_its_weight():
    rows = _readme_rows()
    assert set(rows) == {r.value for r in Rule}
    for rule, w in WEIGHTS.items():
        comp = w.component.value if w.component is not None else "-"
        assert rows[rule.value] == (comp, w.weight, w.subject.value, w.why), rule


def weight(rule: Rule) -> float:
    return DEFAULT_RCA.weight(rule)


def test_formulas_keep_their_base():
    rca = DEFAULT_RCA
    w = weight(Rule.NIC_SEND_BACKLOG)
    assert rca.link_score(Rule.NIC_SEND_BACKLOG, 3) == w * (1 + math.log2(4))
    assert rca.timing_score(Rule.LATE_ARRIVAL, 5.0, 10.0) == 1.5
    assert rca.timing_score(Rule.SLOW_COMPUTE, 50.0, 10.0, capped=True) == 2.5
    assert rca.unconsumed_score(0.5, 0.5, 0.25) == weight(Rule.UNCONSUMED_INPUT) + 0.25


def test_a_weight_override_reaches_the_formulas_and_the_suspects():
    rca = RcaConfig(weights={Rule.NIC_SEND_BACKLOG: 4.0}, span_share_cap=0.5)
    assert rca.weight(Rule.NIC_SEND_BACKLOG) == 4.0
    assert rca.weight(Rule.LATE_ARRIVAL) == WEIGHTS[Rule.LATE_ARRIVAL].weight
    assert rca.link_score(Rule.NIC_SEND_BACKLOG, 1) == 8.0
    assert rca.timing_score(Rule.SLOW_COMPUTE, 50.0, 10.0, capped=True) == 2.0
    board = Suspects(rca)
    board.at(3).add(Rule.NIC_SEND_BACKLOG, "its sends")
    assert board.at(3) is board[3]
    assert board[3].scores == {Component.NIC: 4.0}


def test_suspect_records_what_each_rule_added():
    sus = Suspect(3)
    sus.add(Rule.NEVER_MOVED, "kernel never ran")
    sus.add(Rule.FROZEN_READY_NOT_SENT, "G>T", score=2.5, flow=(4, 1))
    sus.add(Rule.FIRST_TO_STOP, "first", component=sus.best[0])
    assert sus.scores == {Component.GPU: 2.0, Component.NIC: 3.25}
    assert sus.reasons == ["kernel never ran", "G>T", "first"]
    first = sus.observations[1]
    assert (first.rule, first.subject, first.score, first.flow) == (
        Rule.FROZEN_READY_NOT_SENT,
        Subject.NIC,
        2.5,
        (4, 1),
    )
    assert sus.rules == ("never_moved", "frozen_ready_not_sent", "first_to_stop")
    with pytest.raises(ValueError, match="first_to_stop"):
        Suspect(1).add(Rule.FIRST_TO_STOP, "no component")


def test_port_rules_fold_and_scale():
    down, up = Suspect(0), Suspect(2)
    for sus in (down, up):
        sus.add(Rule.NIC_PCIE_BACKLOG, "backlog into it", score=1.2)
    data = (Component.NIC, Component.PCIE)
    down.fold(Rule.PORT_DOWN, data, "port went down")
    up.scale(Rule.PORT_STAYED_UP, data, "port stayed up")
    assert down.scores == {Component.NIC: 1.2 + weight(Rule.PORT_DOWN)}
    assert down.reasons[0] == "port went down" and down.rules[0] == "port_down"
    assert up.scores == {Component.PCIE: 1.2 * weight(Rule.PORT_STAYED_UP)}
    assert up.rules == ("nic_pcie_backlog", "port_stayed_up")


def test_taking_a_mates_scores_takes_their_rules():
    rep, mate = Suspect(0), Suspect(1)
    rep.add(Rule.NIC_SEND_BACKLOG, "a", score=2.0)
    mate.add(Rule.NIC_RECEIVE_BACKLOG, "b", score=1.0)
    mate.add(Rule.LATE_ARRIVAL, "late", score=1.1)
    rep.take(mate, (Component.NIC,))
    assert rep.scores == {Component.NIC: 3.0}
    assert rep.rules == ("nic_send_backlog", "nic_receive_backlog")
    assert mate.rules == ("late_arrival",)


def test_culprits_carry_their_rules_best_first():
    topo = JobTopology("j")
    a, b = Suspect(1), Suspect(2)
    a.add(Rule.NEVER_ISSUED, "never issued")
    b.add(Rule.SEND_TO_UNREADY, "remote cause", flow=(1, 0))
    b.flow = (1, 0)
    out = rank_suspects(topo, Suspects(DEFAULT_RCA, {2: b, 1: a}), FaultKind.HANG)
    assert [(c.rank, c.component, c.rules) for c in out] == [
        (1, Component.HOST, ("never_issued",)),
        (2, Component.NIC, ("send_to_unready",)),
    ]
    assert (out[1].peer, out[1].channel) == (1, 0)
    assert out[0].confidence == round(2.0 / 2.3, 3)


def test_the_caps_of_an_answer_come_from_its_config():
    topo = JobTopology("j")
    board = Suspects(RcaConfig(max_culprits=1, max_confidence=0.9))
    board.at(1).add(Rule.NEVER_ISSUED, "never issued")
    board.at(2).add(Rule.SEND_TO_UNREADY, "remote cause")
    (only,) = rank_suspects(topo, board, FaultKind.HANG)
    assert (only.rank, only.confidence) == (1, 0.87)
    board = Suspects(RcaConfig(max_confidence=0.8))
    board.at(1).add(Rule.NEVER_ISSUED, "never issued")
    assert rank_suspects(topo, board, FaultKind.HANG)[0].confidence == 0.8


def _spread_and_slow() -> Suspects:
    """A backlog over many NICs named on rank 40, a slowed GPU on rank 26."""
    spread, slow, late = Suspect(40), Suspect(26), Suspect(12)
    spread.add(
        Rule.SWITCH_BACKLOG,
        "152 flows over 32 NICs",
        score=DEFAULT_RCA.link_score(Rule.SWITCH_BACKLOG, 152),
    )
    slow.add(Rule.SLOW_COMPUTE, "computes 3.5 ms where peers compute 2.1", score=2.5)
    late.add(Rule.NIC_SEND_BACKLOG, "its sends", score=4.0)
    late.add(Rule.LATE_ARRIVAL, "late", score=1.2)
    return Suspects(DEFAULT_RCA, {40: spread, 26: slow, 12: late})


def test_direct_evidence_explains_away_spread_flow_gaps():
    suspects = _spread_and_slow()
    explain_away(suspects)
    top, *rest = rank_suspects(JobTopology(), suspects, FaultKind.SLOWDOWN)
    assert (top.rank, top.component) == (26, Component.GPU)
    # Symptoms together keep at most half the cause's score, still named.
    assert suspects[40].scores[Component.NETWORK] + suspects[12].scores[
        Component.NIC
    ] == pytest.approx(weight(Rule.EXPLAINED_AWAY) * 2.5)
    assert "explained_away" in suspects[40].rules
    assert {c.rank for c in rest} == {40, 12}


def test_a_component_with_its_own_timing_evidence_is_not_explained():
    suspects = _spread_and_slow()
    rx = suspects.at(7)
    rx.add(Rule.NIC_PCIE_BACKLOG, "flows into it back up", score=6.0)
    rx.add(Rule.READY_LAGS, "copies late", score=1.5)
    explain_away(suspects)
    assert rx.scores[Component.PCIE] == 7.5
    assert "explained_away" not in rx.rules
    assert "explained_away" in suspects[40].rules


def test_without_direct_evidence_flow_gaps_stand():
    suspects = _spread_and_slow()
    del suspects[26]
    before = {r: dict(s.scores) for r, s in suspects.items()}
    explain_away(suspects)
    assert {r: s.scores for r, s in suspects.items()} == before
