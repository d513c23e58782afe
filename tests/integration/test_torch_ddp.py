"""A real DDP job (gloo, 2 ranks) traced with ``MYCROFT_TORCH_TRACE=1``.

DDP's bucket all-reduces and construction-time broadcasts are issued by its
C++ reducer, never through ``torch.distributed``'s Python functions; they
reach the ring through the Flight Recorder poll. Every rank must hold the
same ops under the same numbers, each once, each completed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mycroft.producers import ring_layout as L
from mycroft.producers.ring import RingReader
from mycroft.producers.torch.tracer import comm_hash
from mycroft.schemas.vocab import OP_NAMES
from tests.unit.torch import ddp_job, harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

ITERS = 5


def test_ddp_bucket_allreduces_reach_the_ring(tmp_path: Path) -> None:
    env = harness.traced_env(tmp_path / "rings")
    procs = ddp_job.launch(["--iters", str(ITERS)], 2, env, tmp_path / "logs")
    try:
        codes = [p.wait(120) for p in procs]
    finally:
        harness.job().stop(procs)
    assert codes == [0, 0], harness.logs(tmp_path / "logs")
    world = comm_hash("0")
    per_rank = {}
    for path in sorted((tmp_path / "rings").glob("*.ring")):
        recs = RingReader(path).poll()
        issued = [r for r in recs if isinstance(r, L.OpIssued) and r.comm == world]
        ops = sorted((r.seq, OP_NAMES[r.kind], r.nbytes) for r in issued)
        seqs = [seq for seq, _k, _n in ops]
        assert seqs == list(range(len(seqs))), ops  # each once, no gap
        done = {r.seq for r in recs if isinstance(r, L.OpDone) and r.comm == world}
        assert done == set(seqs)
        beats = [r for r in recs if isinstance(r, L.Beat)]
        assert beats and beats[-1].dropped_ops == 0
        per_rank[RingReader(path).header.rank] = ops
    assert sorted(per_rank) == [0, 1] and per_rank[0] == per_rank[1]
    ops = per_rank[0]
    kinds = [k for _s, k, _n in ops]
    assert kinds[:3] == ["allgather", "broadcast", "broadcast"]  # DDP's set-up
    layer = (128 * 128 + 128) * 4  # bytes of one Linear(128, 128)
    buckets = [n for _s, k, n in ops if k == "allreduce"]
    assert len(buckets) >= 2 * ITERS - 1  # 1 bucket in step 1, then 2 a step
    assert sum(buckets) == 3 * layer * ITERS  # every gradient, every step
