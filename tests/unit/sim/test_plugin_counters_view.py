"""``Hardware(counters="nccl")``: the slots timing as NCCL's profiler plugin
observes it (``schemas/ring.md`` §4b, §4c)."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np

from mycroft.producers.sim.config import Hardware
from tests.unit.sim.trace import RECV, SEND, Trace, run, small_config


@cache
def _trace(counters: str, *specs: str) -> Trace:
    cfg = dataclasses.replace(
        small_config(4.0, seed=11, interval_ms=20),
        hardware=Hardware(counters=counters),
    )
    return run(cfg, *specs)


def _net_sends_of(tr: Trace, rank: int) -> np.ndarray:
    fl = tr.flow
    return (fl["rank"] == rank) & (fl["dir"] == SEND) & tr.net(fl)


def test_a_send_is_ready_at_most_one_step_ahead_on_every_sample() -> None:
    for specs in ((), ("proxy-delay:rank=9,at=1",), ("nic-down:rank=9,at=2",)):
        fl = _trace("nccl", *specs).flow
        send = fl["dir"] == SEND
        assert (fl["gpu_ready"][send] <= fl["transmitted"][send] + 1).all()
        assert (fl["gpu_ready"][send] >= fl["transmitted"][send]).all()
        assert (fl["ready_wait_us"][~send] == 0).all()


def test_only_what_is_observable_changes_from_slots() -> None:
    slots, nccl = _trace("slots"), _trace("nccl")
    a, b = slots.flow, nccl.flow
    for key in ("rank", "seq", "peer", "channel", "transmitted", "done", "total"):
        assert (a[key] == b[key]).all(), key
    recv, send = a["dir"] == RECV, a["dir"] == SEND
    assert (a["gpu_ready"][recv] == b["gpu_ready"][recv]).all()
    head = np.minimum(a["gpu_ready"], a["transmitted"] + 1)
    assert (b["gpu_ready"][send] == head[send]).all()
    assert (a["gpu_ready"][send] > head[send]).any()  # slots shows a backlog
    assert not a["ready_wait_us"].any()  # and no ready-wait


def test_ready_wait_is_cumulative_per_flow() -> None:
    fl = _trace("nccl", "proxy-delay:rank=9,at=1").flow
    key = np.stack(
        [
            fl["rank"],
            fl["comm"].astype(np.int64),
            fl["seq"],
            fl["channel"],
            fl["peer"],
            fl["dir"],
        ],
        axis=1,
    )
    order = np.lexsort((fl["tick"], *key.T[::-1]))
    same = (key[order][1:] == key[order][:-1]).all(axis=1)
    wait = fl["ready_wait_us"][order]
    assert (wait[1:][same] >= wait[:-1][same]).all()


def test_a_stalled_proxy_grows_its_ready_wait() -> None:
    # proxy-delay: 1 s stalls of rank 9's send proxy; its ready head steps
    # wait through them, far beyond the same flows' healthy wait.
    healthy = _trace("nccl")
    faulty = _trace("nccl", "proxy-delay:rank=9,at=1,stall=1,every=3")
    waits = [
        tr.flow["ready_wait_us"][_net_sends_of(tr, 9)].max() for tr in (healthy, faulty)
    ]
    assert waits[1] > 500_000  # most of a 1 s stall
    assert waits[1] > 10 * waits[0]


def test_a_dead_nic_leaves_head_steps_waiting_to_the_end() -> None:
    # The job hangs: the sends into the dead NIC's host wait for credit that
    # never comes, their ready head steps waiting from the onset on.
    tr = _trace("nccl", "nic-down:rank=9,at=2")
    fl = tr.flow
    last = fl["tick"] == fl["tick"].max()
    waiting = last & (fl["dir"] == SEND) & (fl["gpu_ready"] > fl["transmitted"])
    assert waiting.any()
    hung_s = tr.at_s(fl["tick"].max()) - 2.0
    assert fl["ready_wait_us"][waiting].max() >= 0.9 * hung_s * 1e6
