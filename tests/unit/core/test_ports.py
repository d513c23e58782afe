"""NIC port events (heartbeats) and the link end they blame."""

from __future__ import annotations

import dataclasses

import numpy as np

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import Anomaly, Culprit, Heartbeat, NicPort
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.analyze import run as single_stage
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.detect_ports import detect_port_flaps
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.incidents import Incident, Verdict
from mycroft.streams.core.ports import PortEvents, PortLog
from mycroft.streams.core.progress import FLAT_FLOW, ProgressStore
from mycroft.streams.core.rca_config import DEFAULT_RCA
from mycroft.streams.core.rca_ports import (
    PORT_LEAD_NS,
    nominate_far_ends,
    nominate_flapping_ports,
    score_port_events,
)
from mycroft.streams.core.suspect import Suspect, Suspects
from mycroft.streams.core.topology import JobTopology
from mycroft.streams.core.two_stage import TwoStageReplay

S = 1_000_000_000


def _port(
    downed: int, *, up: bool = True, recovered: int = 0, port: int = 1
) -> NicPort:
    return NicPort("mlx5_0", port, up, downed, recovered)


def test_counter_growth_and_down_state_are_events_the_first_reading_is_not():
    log = PortLog()
    log.observe("h0", 1 * S, [_port(7, recovered=3)])  # since boot: history
    log.observe("h0", 2 * S, [_port(7, recovered=3)])
    assert not log.events("h0", "mlx5_0", 0)
    log.observe("h0", 3 * S, [_port(8, recovered=4)])
    log.observe("h0", 4 * S, [_port(8, up=False, recovered=4)])
    assert log.events("h0", "mlx5_0", 0) == PortEvents(2, True)
    assert log.events("h0", "mlx5_0", 4 * S) == PortEvents(0, True)
    assert log.events("h0", "mlx5_1", 0) == PortEvents()
    assert log.events("h1", "mlx5_0", 0) == PortEvents()


def test_resets_unreadable_counters_and_other_ports_are_no_events():
    log = PortLog()
    log.observe("h0", 1 * S, [_port(200), _port(5, port=2)])
    log.observe("h0", 2 * S, [_port(0), _port(-1, recovered=-1, port=2)])  # reset
    log.observe("h0", 3 * S, [_port(0), _port(9, port=2)])  # -1 was a gap
    assert not log.events("h0", "mlx5_0", 0)
    log.observe("h0", 4 * S, [_port(0), _port(10, port=2)])
    assert log.events("h0", "mlx5_0", 0) == PortEvents(1, False)


def _ctx() -> DetectContext:
    cfg = DetectorConfig()
    topo = JobTopology()
    for r in range(4):  # ranks 0, 1 on h0's mlx5_0; 2, 3 on h1's
        topo.rank_host[r] = f"h{r // 2}"
        topo.rank_nic[r] = "mlx5_0"
    return DetectContext("j", ProgressStore(cfg.history_ns), topo, BaselineBook(8), cfg)


def _tie() -> Suspects:
    """Both ends of one NIC pair blamed alike, the sender a little more."""
    out = Suspects(DEFAULT_RCA, {0: Suspect(0), 2: Suspect(2)})
    out[0].add(
        Rule.FROZEN_READY_NOT_SENT, "sends frozen ready but not transmitted", score=2.5
    )
    out[2].add(Rule.NEVER_MOVED, "moved nothing")
    out[2].add(Rule.RECEIVER_NIC_SILENT, "or the receiving NIC")
    return out


def test_the_end_whose_port_went_down_takes_the_link_blame():
    ctx = _ctx()
    for t in (1, 2, 3):
        ctx.store.ports.observe("h0", t * S, [_port(0)])
        ctx.store.ports.observe("h1", t * S, [_port(0, up=t < 3)])
    suspects = _tie()
    score_port_events(ctx, suspects, 2 * S)
    assert suspects[2].best == (Component.NIC, 2.5)
    assert suspects[2].reasons[0].startswith("port of mlx5_0 on h1 was seen down")
    assert suspects[0].best == (Component.NIC, 1.25)
    assert "stayed up while rank 2's went down" in suspects[0].reasons[-1]
    starved = Suspects(
        DEFAULT_RCA, {2: Suspect(2)}
    )  # flows into its GPU backed up: pcie-like
    starved[2].add(Rule.READY_LAGS, "gpu_ready lags on flows into it", score=1.2)
    score_port_events(ctx, starved, 2 * S)
    assert starved[2].scores == {Component.NIC: 2.7}


def test_without_port_events_nothing_changes():
    ctx = _ctx()
    for t in (1, 2, 3):  # every port up; a flap long before the incident
        ctx.store.ports.observe("h0", t * S, [_port(0)])
        ctx.store.ports.observe("h1", t * S, [_port(0 if t < 2 else 1)])
    suspects = _tie()
    score_port_events(ctx, suspects, 2 * S + PORT_LEAD_NS + 1)
    assert {r: s.scores for r, s in suspects.items()} == {
        r: s.scores for r, s in _tie().items()
    }


def test_a_hangs_far_end_behind_a_dead_port_is_a_nic_candidate():
    """Under credits the sender over a dead link shows only T > D, which no
    rule blames on its NIC: its port, down, makes it the candidate that
    ``score_port_events`` names, over the receiver blamed from its flows."""
    ctx = _ctx()
    for t in (1, 2, 3):
        ctx.store.ports.observe("h0", t * S, [_port(0, up=t < 3)])
        ctx.store.ports.observe("h1", t * S, [_port(0)])
    flows = np.zeros(2, dtype=FLAT_FLOW)
    flows["rank"], flows["peer"], flows["total"] = [2, 2], [0, 1], 8
    flows["done"] = [0, 8]  # the flow from rank 1 completed
    suspects = Suspects(DEFAULT_RCA, {2: Suspect(2)})
    suspects[2].add(Rule.SENT_NOT_DONE_INTO, "peer sends into it never done")
    nominate_far_ends(ctx, suspects, flows, 2 * S)
    assert set(suspects) == {0, 2}  # rank 1's NIC is the dead one's mate
    score_port_events(ctx, suspects, 2 * S)
    top = max(suspects.values(), key=lambda s: s.best[1])
    assert (top.rank, top.best[0]) == (0, Component.NIC)


def test_a_nic_dead_under_a_pipeline_transfer_is_named_by_its_port():
    """Rank 8's NIC dies while it receives a pipeline transfer from rank 40's
    NIC: the flows blame both ends (without port state the sender is named);
    the port that went down names the right one, in one stage and in two."""
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=10.0, seed=5, job_id="sim")
    writer = ListWriter()
    simulate(cfg, [parse_spec("nic-down:rank=8,at=6")], writer)
    old_agent = [
        (ts, dataclasses.replace(r, nics=()) if isinstance(r, Heartbeat) else r)
        for ts, r in writer.records
    ]
    two = TwoStageReplay("sim", groups=4)
    for ts, rec in writer.records:
        two.feed(ts, rec)
    two.close()
    best = {}
    for name, causes in (
        ("ports", single_stage(writer.records)[1]),
        ("no ports", single_stage(old_agent)[1]),
        ("two stages", two.causes),
    ):
        (cause,) = causes.values()
        best[name] = cause.culprits[0]
    assert best["ports"].reason.startswith("port of mlx5_0 on node0001 went down")
    assert {n: (c.rank in (8, 9), c.component) for n, c in best.items()} == {
        "ports": (True, Component.NIC),
        "no ports": (False, Component.NIC),
        "two stages": (True, Component.NIC),
    }


def test_a_port_heard_late_overturns_a_confident_far_end_answer():
    """The first answer named the far end of a dead link (rank 2, 0.99)
    before rank 0's failed port was heard; a new answer naming rank 0's NIC
    revises it although it is less confident. Without that port event, a
    same-rank answer, or a far end whose own port went down, it does not."""
    an = Analyzer("j")
    an.ctx = _ctx()
    inc = Incident("j:hang:1:0", FaultKind.HANG, 10 * S, 11 * S)
    inc.anomalies["a"] = Anomaly(
        "a", "j", FaultKind.HANG, (1,), (0, 2), 10 * S, 11 * S, "hang", "stalled"
    )
    far = Culprit(2, "h1", Component.NIC, FaultKind.HANG, 0.99, 0, 0)
    inc.published = Verdict(FaultKind.HANG, (far,))
    near = [Culprit(0, "h0", Component.NIC, FaultKind.HANG, 0.67)]
    assert not an.port_turn(near, inc)  # no port heard yet
    for t in (8, 9, 12):
        an.ctx.store.ports.observe("h0", t * S, [_port(0, up=t < 12)])
        an.ctx.store.ports.observe("h1", t * S, [_port(0)])
    assert an.port_turn(near, inc)
    assert not an.port_turn([_on_rank(near[0], 2)], inc)
    gpu = [Culprit(0, "h0", Component.GPU, FaultKind.HANG, 0.67)]
    assert not an.port_turn(gpu, inc)
    an.ctx.store.ports.observe("h1", 13 * S, [_port(1)])  # the far end flapped too
    assert not an.port_turn(near, inc)


def _on_rank(c: Culprit, rank: int) -> Culprit:
    return dataclasses.replace(c, rank=rank, host=f"h{rank // 2}")


def _flaps(log: PortLog, beats: list[int], *, host: str = "h0") -> None:
    """One heartbeat a second from 1 s; at each of ``beats`` the port's
    link_downed counter grew by one since the heartbeat before."""
    downed = 0
    for t in range(1, max(beats) + 2):
        downed += t in beats
        log.observe(host, t * S, [_port(downed)])


def test_a_port_that_keeps_going_down_is_flapping_one_retrain_is_not():
    cfg = DetectorConfig()
    window = int(cfg.port_flap_window_s * S)
    once, thrice = PortLog(), PortLog()
    _flaps(once, [3])
    _flaps(thrice, [3, 4, 6])
    assert once.flapping(8 * S, window, cfg.port_flap_need) == []
    assert thrice.flapping(8 * S, window, cfg.port_flap_need) == [
        ("h0", "mlx5_0", 3 * S, 3)
    ]
    # The episode ends once the window holds too few events again.
    assert thrice.flapping(20 * S, window, cfg.port_flap_need) == []


def test_a_flapping_port_is_an_anomaly_of_its_ranks_and_names_their_nic():
    """Port counters alone: no flow flagged anything, yet the NIC whose port
    keeps retraining is detected and named, and a NIC no rank uses is not."""
    ctx = _ctx()
    _flaps(ctx.store.ports, [3, 4, 5, 6])
    _flaps(ctx.store.ports, [3, 4, 5, 6], host="storage0")
    (found,) = detect_port_flaps(ctx, 7 * S)
    assert (found.kind, found.ranks, found.onset_ns) == (
        FaultKind.SLOWDOWN,
        (0, 1),
        3 * S,
    )
    suspects = Suspects(DEFAULT_RCA)
    nominate_flapping_ports(ctx, suspects, 3 * S)
    score_port_events(ctx, suspects, 3 * S)
    assert sorted(suspects) == [0, 1]
    assert {s.best[0] for s in suspects.values()} == {Component.NIC}


def test_a_port_flap_fault_is_named_as_the_nic_from_a_simulated_job():
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=16.0, seed=3, job_id="sim")
    writer = ListWriter()
    simulate(cfg, [parse_spec("port-flap:rank=9,at=5,severity=0.1")], writer)
    _, causes = single_stage(writer.records)
    (cause,) = causes.values()
    best = cause.culprits[0]
    assert (best.rank in (8, 9), best.component, cause.kind) == (
        True,
        Component.NIC,
        FaultKind.SLOWDOWN,
    )
