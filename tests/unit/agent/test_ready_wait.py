"""A send flow's ready-wait time: FLOW_STEPS joined into the state rows."""

from __future__ import annotations

from pathlib import Path

from mycroft.producers import ring_layout as L
from mycroft.producers.agent.aggregate import READY_WAIT_MAX_US, Aggregator
from mycroft.producers.agent.sources import RingSource
from mycroft.producers.ring import RingWriter

C = 0xC0FFEE


def _ring(path: Path) -> RingWriter:
    w = RingWriter(path, rank=3, nslots=64, version=L.VERSION_MAX)
    w.write(L.Comm(1, C, 8, 3, 2, 0))
    w.write(L.OpIssued(2, C, 0, 1 << 20, 0, 1, 1, 2))
    return w


def _steps(ts: int, ch: int, d: int, peer: int, wait_us: int) -> L.FlowSteps:
    return L.FlowSteps(ts, C, 0, ch, d, peer, 4, wait_us, 0)


def test_flow_steps_of_a_send_fill_its_ready_wait(tmp_path: Path) -> None:
    w = _ring(tmp_path / "r3.ring")
    w.flow_progress(10, C, 0, 0, 0, 4, 8, 3, 2, 1)  # send, G = T + 1
    w.write(_steps(10, 0, 0, 4, 1500))
    w.flow_progress(10, C, 0, 0, 1, 2, 8, 4, 3, 1)  # recv: received, no wait
    w.write(_steps(10, 0, 1, 2, 3))
    w.flow_progress(20, C, 0, 0, 0, 4, 8, 3, 2, 1)  # unchanged counters...
    w.write(_steps(20, 0, 0, 4, 2700))  # ...while the head step waits longer
    agg, src = Aggregator(), RingSource(tmp_path)
    src.scan(agg)
    src.drain()

    rows = agg.tick()
    assert rows.flow[["peer", "dir", "gpu_ready", "ready_wait_us"]].tolist() == [
        (2, 1, 4, 0),
        (4, 0, 3, 2700),
    ]
    assert rows.flow["last_ns"].tolist() == [10, 10]  # waiting is no progress


def test_flow_steps_join_only_their_own_progress() -> None:
    agg = Aggregator()
    agg.add_rank("r", rank=3, pid=1)
    agg.apply("r", L.OpIssued(2, C, 0, 64, 0, 1, 1, 1))
    agg.apply("r", L.FlowProgress(10, C, 0, 0, 0, 4, 8, 2, 1, 0))
    agg.apply("r", _steps(9, 0, 0, 4, 800))  # another ts: its progress was lost
    agg.apply("r", _steps(10, 1, 0, 4, 900))  # another channel
    agg.apply("r", _steps(10, 0, 0, 4, -1))  # u32 0xFFFFFFFF read as i32
    assert agg.tick().flow["ready_wait_us"].tolist() == [READY_WAIT_MAX_US]


def test_rings_without_flow_steps_report_no_ready_wait(tmp_path: Path) -> None:
    w = _ring(tmp_path / "r3.ring")
    w.flow_progress(10, C, 0, 0, 0, 4, 8, 3, 2, 1)
    agg, src = Aggregator(), RingSource(tmp_path)
    src.scan(agg)
    src.drain()
    assert agg.tick().flow["ready_wait_us"].tolist() == [0]
