"""Workload(moe_bytes=...): dispatch and combine all-to-alls over each TP
group after every TP all-reduce, with a token imbalance drawn per call."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mycroft.errors import ConfigError
from mycroft.producers.sim.config import SimConfig, Workload
from mycroft.producers.sim.schedule import moe_sizes
from mycroft.schemas.vocab import OP_NAMES
from tests.unit.sim.trace import run

MOE = SimConfig(
    tp=4, pp=1, dp=2, duration_s=2.0, seed=4, workload=Workload(moe_bytes=8 << 20)
)
"""8 ranks on one host: two expert-parallel (TP) groups of 4."""
ALLTOALL = OP_NAMES.index("alltoall")


def test_dispatch_sizes_agree_and_combine_sizes_carry_the_imbalance() -> None:
    rng = np.random.default_rng(0)
    dispatch, combine = moe_sizes(rng, (3, 8), 1 << 20, 0.5)
    assert (dispatch == 1 << 20).all()
    assert (combine.max(axis=1) > 1.5 * combine.min(axis=1)).all()
    # Every token sent comes back: a group's combine carries its dispatch.
    assert np.allclose(combine.sum(axis=1), 8 << 20, rtol=1e-5)
    _, next_call = moe_sizes(rng, (3, 8), 1 << 20, 0.5)
    assert (next_call != combine).any()  # drawn anew every call


def test_no_imbalance_means_even_splits() -> None:
    _, combine = moe_sizes(np.random.default_rng(1), (2, 4), 4096, 0.0)
    assert (abs(combine - 4096) <= 4096 * 0.4).all()  # routing noise only


def test_moe_job_reports_uneven_all_to_alls_on_its_tp_comms() -> None:
    tr = run(MOE)
    a2a = tr.done["kind"] == ALLTOALL
    assert a2a.any()
    comm, seq, nbytes = (tr.done[k][a2a] for k in ("comm", "seq", "bytes"))
    assert set(comm.tolist()) <= set(tr.done["comm"][tr.done["kind"] == 0].tolist())
    per_op = {}
    for c, s, b in zip(comm.tolist(), seq.tolist(), nbytes.tolist(), strict=True):
        per_op.setdefault((c, s), set()).add(b)
    uneven = sum(len(v) > 1 for v in per_op.values())
    assert uneven >= len(per_op) // 3  # the combines (dispatches agree)


def test_moe_off_by_default_and_validated() -> None:
    assert Workload().moe_bytes == 0
    bad = dataclasses.replace(MOE, workload=Workload(moe_bytes=-1))
    with pytest.raises(ConfigError, match="--moe-bytes"):
        bad.validate()
