"""The load generator: many ranks from a small template, valid and monotone."""

from __future__ import annotations

import numpy as np

from mycroft.producers.sim.config import SimConfig, Workload
from mycroft.producers.sim.loadgen import LoadConfig, LoadGen
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Record, StateBatch


def test_loadgen_replicates_template_and_loops_monotonically() -> None:
    tpl = SimConfig(
        tp=8, pp=1, dp=2, duration_s=0.5, workload=Workload(micro_batches=2)
    )
    gen = LoadGen(LoadConfig(ranks=64, template=tpl))
    assert gen.replicas == 4 and gen.hosts == 8
    out: list[Record] = []
    n = gen.run(12, out.append)
    states = [r for r in out if isinstance(r, StateBatch)]
    assert n == len(out) and len(states) == 12 * 8
    ranks = np.concatenate([s.rc["rank"] for s in states])
    assert set(ranks.tolist()) == set(range(64))
    codec = Codec()
    assert all(isinstance(codec.decode(codec.encode(r)), type(r)) for r in out[:20])
    host0 = [s for s in states if s.header.host == "node0000"]
    ticks = [s.header.tick_ns for s in host0]
    assert ticks == sorted(ticks) and len(set(ticks)) == 12
    issued = np.stack([s.rc["issued_seq"] for s in host0])
    assert (np.diff(issued, axis=0) >= 0).all()
