"""Workload(schedule="interleaved-1f1b", virtual_stages=v): Megatron's
interleaved 1F1B over v model chunks per pipeline stage."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest

from mycroft.errors import ConfigError
from mycroft.producers.sim.config import Hardware, SimConfig, Workload
from mycroft.producers.sim.layout import build_layout
from mycroft.producers.sim.schedule import interleaved
from tests.unit.sim.trace import Trace, run

BASE = SimConfig(
    tp=2,
    pp=4,
    dp=2,
    duration_s=4.0,
    seed=3,
    hardware=Hardware(gpus_per_host=4),
    workload=Workload(micro_batches=8, schedule="1f1b"),
)
"""16 ranks on 4 hosts: stage p holds ranks 4p..4p+3."""
INTERLEAVED = Workload(micro_batches=8, schedule="interleaved-1f1b", virtual_stages=2)


def test_order_is_megatrons() -> None:
    # pp 2, 4 micro-batches, 2 chunks: stage 0 warms up 2 * 1 + 1 * 2 = 4.
    assert interleaved(2, 4, 2, 0) == [
        (True, 0, 0), (True, 0, 1), (True, 1, 0), (True, 1, 1),
        (True, 0, 2), (False, 1, 0), (True, 0, 3), (False, 1, 1),
        (True, 1, 2), (False, 0, 0), (True, 1, 3), (False, 0, 1),
        (False, 1, 2), (False, 1, 3), (False, 0, 2), (False, 0, 3),
    ]  # fmt: skip
    for s in range(4):
        steps = interleaved(4, 8, 3, s)
        assert sorted(steps) == sorted(
            (f, c, j) for f in (True, False) for c in range(3) for j in range(8)
        )
        # Warm-up forwards, then the steady state opens with a forward.
        first_backward = next(i for i, (f, _, _) in enumerate(steps) if not f)
        assert first_backward == (4 - s - 1) * 2 + 2 * 4 + 1


@cache
def _run(workload: Workload) -> Trace:
    return run(dataclasses.replace(BASE, workload=workload))


def _per_iteration(tr: Trace, rank: int, *kinds: str) -> float:
    d = tr.done
    mine = d["rank"] == rank
    iters = (mine & tr.of_kind(d, "reducescatter")).sum()
    return float((mine & tr.of_kind(d, *kinds)).sum()) / max(int(iters), 1)


def test_last_stage_feeds_the_first_stage_next_chunk() -> None:
    lay = build_layout(dataclasses.replace(BASE, workload=INTERLEAVED))
    assert len(lay.pp) == 4  # pairs (0,1), (1,2), (2,3) and the wrap (3,0)
    assert lay.pp[-1].ranks[:, 0].tolist() == [12, 13, 14, 15]
    assert lay.pp[-1].ranks[:, 1].tolist() == [0, 1, 2, 3]
    for workload, wraps in ((INTERLEAVED, True), (BASE.workload, False)):
        fl = _run(workload).done_flow
        last_to_first = (fl["rank"] >= 12) & (fl["peer"] < 4)
        assert last_to_first.sum() > 100 if wraps else not last_to_first.any()


def test_chunks_double_the_pipeline_transfers_not_the_tp_work() -> None:
    one, two = _run(BASE.workload), _run(INTERLEAVED)
    p2p = _per_iteration(two, 4, "send", "recv") / _per_iteration(
        one, 4, "send", "recv"
    )
    assert 1.8 < p2p < 2.2
    tp = _per_iteration(two, 4, "allreduce") / _per_iteration(one, 4, "allreduce")
    assert 0.9 < tp < 1.1
    assert two.result.iterations >= 3


def test_interleaving_is_validated() -> None:
    with pytest.raises(ConfigError, match="virtual_stages"):
        Workload(schedule="1f1b", virtual_stages=2).validate()
    with pytest.raises(ConfigError, match="multiple"):
        dataclasses.replace(
            BASE,
            workload=Workload(
                micro_batches=6, schedule="interleaved-1f1b", virtual_stages=2
            ),
        ).validate()
