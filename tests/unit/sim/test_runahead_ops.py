"""Hardware(runahead_ops=N): the CPU enqueues up to N ops ahead of the GPU,
waiting at pipeline exchanges and at the end of each iteration."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mycroft.errors import ConfigError
from mycroft.producers.sim.config import Hardware, SimConfig, Workload
from mycroft.schemas.vocab import OP_NAMES
from tests.unit.sim.trace import Trace, run

NO_PIPELINE = SimConfig(
    tp=2,
    pp=1,
    dp=8,
    duration_s=3.0,
    seed=3,
    hardware=Hardware(gpus_per_host=4),
    workload=Workload(micro_batches=6),
)
"""16 ranks, 24 TP all-reduces per iteration between syncs."""
PIPELINE = dataclasses.replace(NO_PIPELINE, pp=4, dp=2)


def _run(cfg: SimConfig, ops: int) -> Trace:
    hw = dataclasses.replace(cfg.hardware, runahead_ops=ops)
    return run(dataclasses.replace(cfg, hardware=hw))


def _queued(tr: Trace) -> int:
    """Most ops of one rank sampled issued and not started at one tick."""
    op = tr.op
    waiting = op["start_ns"] == 0
    _, counts = np.unique(
        op["tick"][waiting] * 1000 + op["rank"][waiting], return_counts=True
    )
    return int(counts.max())


def test_cpu_runs_n_ops_ahead() -> None:
    assert _queued(_run(NO_PIPELINE, 0)) == 1  # the fraction model: one op
    for n in (2, 6):
        assert _queued(_run(NO_PIPELINE, n)) == n


def _issued_before_previous_end(tr: Trace) -> dict[str, int]:
    """Per kind of op k: how often op k+1 of the rank was issued before op
    k ended (the CPU did not wait for it)."""
    d = tr.done
    out: dict[str, int] = {}
    for rank in np.unique(d["rank"]):
        mine = np.flatnonzero(d["rank"] == rank)
        mine = mine[np.argsort(d["issue_ns"][mine])]
        early = d["issue_ns"][mine[1:]] < d["end_ns"][mine[:-1]]
        for k, e in zip(d["kind"][mine[:-1]].tolist(), early.tolist(), strict=True):
            name = "p2p" if OP_NAMES[k] in ("send", "recv") else OP_NAMES[k]
            out[name] = out.get(name, 0) + int(e)
    return out


def test_syncs_at_pipeline_exchanges_and_iteration_ends() -> None:
    tr = _run(PIPELINE, 6)
    early = _issued_before_previous_end(tr)
    assert early["allreduce"] > 100  # TP ops queue behind each other
    assert early.get("p2p", 0) == 0  # the CPU waited for every exchange
    assert early.get("allgather", 0) == 0  # and for the end of the step
    assert _queued(tr) >= 2
    # Enqueued during the compute before it, an op never precedes the end
    # of the one before.
    assert sum(_issued_before_previous_end(_run(PIPELINE, 0)).values()) == 0


def test_runahead_ops_range() -> None:
    with pytest.raises(ConfigError, match="runahead_ops"):
        Hardware(runahead_ops=-1).validate()
