"""A send's ready-wait time (``schemas/ring.md`` §4c) as G-T evidence: a
producer whose send G is at most T + 1 shows a backlog only as time."""

from __future__ import annotations

import dataclasses

import numpy as np

from mycroft.producers.sim.config import Hardware, SimConfig, Workload
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.schemas.records import Record, StateBatch
from mycroft.streams.analyze import Replay
from mycroft.streams.core.flow_features import posted_gap
from mycroft.streams.core.progress import FLAT_FLOW, held_ready, ready_wait_chunks

MS = 1_000_000


def _flows(n: int) -> np.ndarray:
    rows = np.zeros(n, dtype=FLAT_FLOW)
    rows["rank"], rows["comm"], rows["peer"] = np.arange(n), 9, 100
    return rows


def test_the_share_of_an_interval_waited_stands_for_that_share_of_a_fifo() -> None:
    prev, now = _flows(5), _flows(5)
    prev["tick_ns"], now["tick_ns"] = 100 * MS, 200 * MS
    prev["seq"][1] = 1  # rank 1's op has no earlier snapshot
    prev["ready_wait_us"] = [1_000, 0, 7, 0, 0]
    now["ready_wait_us"] = [101_000, 25_000, 7, 25_000, 0]
    start = np.array([0, 150 * MS, 0, 50 * MS, 0])

    got = ready_wait_chunks(now, prev, start, 8.0)
    # a whole interval; half the time since its op began; nothing since;
    # a quarter of the interval since a snapshot that had waited none; none
    assert got.tolist() == [8, 4, 0, 2, 0]


def test_held_ready_is_g_minus_t_unless_the_wait_says_more() -> None:
    rows = _flows(3)
    rows["gpu_ready"], rows["transmitted"] = [5, 3, 3], [2, 2, 3]
    rows["rw_chunks"] = [1, 6, 0]
    assert held_ready(rows).tolist() == [3, 6, 0]


def test_a_wait_with_a_buffer_posted_is_the_transports_else_the_credits() -> None:
    send = _flows(3)
    send["gpu_ready"], send["transmitted"] = [3, 3, 9], [2, 2, 4]
    send["rw_chunks"] = [8, 8, 0]
    sent = send["transmitted"].astype(np.float64)
    posted = np.array([4.0, 2.0, 6.0])  # the receiver's buffers at the time
    gap, credit = posted_gap(send, sent, posted)
    assert gap.tolist() == [8.0, 0.0, 2.0]  # no wait: G-T split as before
    assert credit.tolist() == [0.0, 8.0, 3.0]


class _NoReadyWait:
    """Pass records on with the state's ready-wait column zeroed: what the
    analyzer saw before the column existed."""

    def __init__(self, inner: Replay) -> None:
        self.inner = inner

    def write(self, record: Record, ts_ns: int) -> None:
        if isinstance(record, StateBatch):
            flow = record.flow.copy()
            flow["ready_wait_us"] = 0
            record = dataclasses.replace(record, flow=flow)
        self.inner.write(record, ts_ns)


def _proxy_delay(strip: bool) -> list[tuple[int, str]]:
    cfg = SimConfig(
        tp=4,
        pp=2,
        dp=8,
        duration_s=16.0,
        seed=1,
        hardware=Hardware(counters="nccl"),
        workload=Workload(micro_batches=4),
    )
    replay = Replay()
    writer = _NoReadyWait(replay) if strip else replay
    simulate(cfg, [parse_spec("proxy-delay:rank=33,at=8")], writer)  # type: ignore[arg-type]
    _, causes = replay.finish()
    return [(c.culprits[0].rank, str(c.culprits[0].component)) for c in causes.values()]


def test_a_stalled_proxy_seen_only_through_its_ready_wait_is_named() -> None:
    # NCCL's send G is at most T + 1: a stalled proxy's G-T is one chunk,
    # which no G-T rule reads as a backlog; its head step's wait names it.
    assert (33, "proxy") in _proxy_delay(strip=False)
    assert (33, "proxy") not in _proxy_delay(strip=True)
