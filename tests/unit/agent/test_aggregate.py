"""Raw ring records -> StateBatch/CompletionBatch rows, per columns.py semantics."""

from __future__ import annotations

from mycroft.producers import ring_layout as L
from mycroft.producers.agent.aggregate import Aggregator

C = 0xC0FFEE


def _agg() -> Aggregator:
    agg = Aggregator()
    agg.add_rank("r3", rank=3, pid=100)
    agg.apply("r3", L.Comm(10, C, 8, 3, 2, 0))
    return agg


def test_in_flight_op_rows_and_flow_counters() -> None:
    agg = _agg()
    agg.apply("r3", L.OpIssued(100, C, 0, 4096, 0, 1, 1, 2))
    agg.apply("r3", L.FlowProgress(150, C, 0, 0, 0, 4, 8, 0, 0, 0))
    agg.apply("r3", L.FlowProgress(200, C, 0, 0, 0, 4, 8, 3, 2, 1))
    agg.apply("r3", L.FlowProgress(300, C, 0, 0, 0, 4, 8, 3, 2, 1))  # unchanged
    agg.apply("r3", L.FlowProgress(250, C, 0, 1, 1, 2, 8, 1, 0, 0))
    rows = agg.tick()
    assert rows.rc.tolist() == [(3, C, 0, -1, 300)]
    assert rows.op.tolist() == [(3, C, 0, 0, 1, 1, 4096, 100, 200, 2)]
    # flows sorted by (channel, peer, dir); last_ns = last *change*, not last report
    assert rows.flow.tolist() == [
        (0, 4, 0, 8, 3, 2, 1, 200, 0),  # no FLOW_STEPS: no ready-wait
        (1, 2, 1, 8, 1, 0, 0, 250, 0),
    ]
    for f in rows.flow:
        assert f["total"] >= f["gpu_ready"] >= f["transmitted"] >= f["done"] >= 0
    assert len(rows.done_op) == 0


def test_completion_rows_use_flow_done_records_and_reset_each_tick() -> None:
    agg = _agg()
    agg.apply("r3", L.OpIssued(100, C, 0, 4096, 2, 1, 1, 1))
    agg.apply("r3", L.FlowProgress(200, C, 0, 0, 0, 4, 8, 8, 8, 8))
    agg.apply("r3", L.FlowDone(400, C, 0, 190, 0, 0, 4, 8, wire_us=3))
    agg.apply("r3", L.OpDone(410, C, 0, 180, 1))
    rows = agg.tick()
    assert rows.done_op.tolist() == [(3, C, 0, 2, 4096, 100, 180, 410, 1)]
    assert rows.done_flow.tolist() == [(0, 4, 0, 8, 190, 400, 3000)]  # wire, ns
    assert rows.rc.tolist() == [(3, C, 0, 0, 410)]
    assert len(rows.op) == 0 and len(rows.flow) == 0
    assert len(agg.tick().done_op) == 0


def test_lost_flow_done_falls_back_to_progress_snapshots() -> None:
    agg = _agg()
    agg.apply("r3", L.FlowProgress(200, C, 5, 0, 0, 4, 8, 8, 8, 8))  # issue record lost
    agg.apply("r3", L.OpDone(300, C, 5, 0, 1))
    rows = agg.tick()
    assert rows.done_op.tolist() == [(3, C, 5, 0, 0, 200, 200, 300, 1)]
    assert rows.done_flow.tolist() == [(0, 4, 0, 8, 200, 200, 0)]


def test_resume_rebuilds_state_without_re_emitting() -> None:
    agg = _agg()
    agg.apply("r3", L.OpIssued(100, C, 0, 1, 0, 0, 0, 1), emit=False)
    agg.apply("r3", L.OpDone(200, C, 0, 150, 0), emit=False)
    agg.apply("r3", L.OpIssued(300, C, 1, 1, 0, 0, 0, 1), emit=False)
    rows = agg.tick()
    assert len(rows.done_op) == 0
    assert rows.rc.tolist() == [(3, C, 1, 0, 300)]
    assert rows.op["seq"].tolist() == [1]


def test_in_flight_ops_are_bounded_and_evictions_counted() -> None:
    agg = Aggregator(max_inflight=4)
    agg.add_rank("r0", 0, 1)
    for s in range(10):
        agg.apply("r0", L.OpIssued(s, C, s, 1, 0, 0, 0, 0))
    assert agg.evicted == 6
    assert agg.tick().op["seq"].tolist() == [6, 7, 8, 9]


def test_a_comm_without_listed_members_is_declared_by_its_positions() -> None:
    """The NCCL plugin writes no COMM_RANKS: the host's own ranks at their
    positions, -1 at the others; flow peers stay positions (the worker maps)."""
    agg = _agg()  # rank 3 at position 3 of 8
    agg.add_rank("r5", rank=5, pid=101)
    agg.apply("r5", L.Comm(10, C, 8, 6, 2, 1))
    assert agg.members(C) == (-1, -1, -1, 3, -1, -1, 5, -1)
    agg.apply("r3", L.FlowProgress(200, C, 0, 0, 0, 6, 8, 3, 2, 1))
    assert agg.tick().flow["peer"].tolist() == [6]


def test_flow_peers_are_mapped_when_every_position_runs_here() -> None:
    agg = Aggregator()
    for pos, rank in enumerate((12, 13)):
        agg.add_rank(f"r{rank}", rank=rank, pid=rank)
        agg.apply(f"r{rank}", L.Comm(10, C, 2, pos, 1, pos))
    assert agg.members(C) == (12, 13)
    agg.apply("r12", L.FlowProgress(200, C, 0, 0, 0, 1, 8, 3, 2, 1))
    agg.apply("r13", L.FlowProgress(200, C, 0, 0, 1, 0, 8, 3, 2, 1))
    agg.apply("r13", L.FlowDone(400, C, 0, 190, 0, 1, 0, 8))
    agg.apply("r13", L.OpDone(410, C, 0, 180, 1))
    rows = agg.tick()
    assert rows.flow["peer"].tolist() == [13]
    assert rows.done_flow["peer"].tolist() == [12]


def test_listed_members_and_their_global_peers_are_kept() -> None:
    agg = _agg()
    agg.apply("r3", L.CommRanks(10, C, 8, 0, 0, 1, 2, 3, 4, 5))
    agg.apply("r3", L.CommRanks(10, C, 8, 6, 6, 7))
    assert agg.members(C) == tuple(range(8))
    agg.apply("r3", L.FlowProgress(200, C, 0, 0, 0, 7, 8, 3, 2, 1))
    assert agg.tick().flow["peer"].tolist() == [7]
