"""A real MoE job (gloo, 4 ranks): uneven ``all_to_all_single`` every step.

``tests/unit/torch/moe_job.py`` dispatches each rank's tokens to one expert
per rank with split sizes drawn anew every step, and combines them back, so
the members of one all-to-all report different input sizes (the combine's:
what each expert got). What the torch tracer writes for it must join into
agreeing collectives (no mismatch), and a live healthy run through agent,
broker and worker must raise no root cause.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from subprocess import Popen

import numpy as np
import pytest

from mycroft.producers.agent.aggregate import Aggregator
from mycroft.producers.ring import RingReader
from mycroft.producers.torch.tracer import comm_hash
from mycroft.schemas.records import BatchHeader, CompletionBatch
from mycroft.schemas.vocab import OP_NAMES
from mycroft.streams.core.completions import CompletionTracker
from mycroft.streams.core.detect import detect_mismatch
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.faust_settings import StreamSettings
from tests.unit.torch import harness, live, moe_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

ALLTOALL = OP_NAMES.index("alltoall")
HEALTHY_S = 40.0
STEP_SLEEP = ["--iter-sleep-s", "0.05"]  # an expert's compute between layers


def _done_rows(ring_dir: Path) -> np.ndarray:
    """Every completion the agent's aggregator makes of the job's rings."""
    agg = Aggregator()
    for path in sorted(ring_dir.glob("*.ring")):
        reader = RingReader(path)
        agg.add_rank(path.name, reader.header.rank, reader.header.pid)
        for rec in reader.poll():
            agg.apply(path.name, rec)
    return agg.tick().done_op


def test_uneven_all_to_all_joins_without_a_mismatch(tmp_path: Path) -> None:
    env = harness.traced_env(tmp_path / "rings")
    procs = moe_job.launch(["--iters", "8"], 4, env, tmp_path / "logs")
    try:
        codes = [p.wait(120) for p in procs]
    finally:
        harness.job().stop(procs)
    assert codes == [0, 0, 0, 0], harness.logs(tmp_path / "logs")
    done = _done_rows(tmp_path / "rings")
    world = done[done["comm"] == comm_hash("0")]
    a2a = world[world["kind"] == ALLTOALL]
    assert len(a2a) == 4 * 2 * 8  # dispatch and combine, every rank, every step
    sizes = {
        seq: set(a2a["bytes"][a2a["seq"] == seq].tolist())
        for seq in set(a2a["seq"].tolist())
    }
    assert sum(len(s) > 1 for s in sizes.values()) >= 8  # combines differ
    tracker = CompletionTracker()
    header = BatchHeader("moe", "h", 1, 0, 0, 100)
    stats = tracker.ingest(CompletionBatch(header, world), {comm_hash("0"): 4}, 0)
    assert len(stats) == len(set(world["seq"].tolist()))
    assert len(tracker.signature_rows()) == 0
    assert detect_mismatch(Analyzer("moe").ctx, 0, world) == []


def _paced(
    args: Sequence[str], world: int, env: Mapping[str, str], log_dir: Path
) -> list[Popen[bytes]]:
    return moe_job.launch([*args, *STEP_SLEEP], world, env, log_dir)


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamSettings]:
    yield from live.worker(kafka_bootstrap, tmp_path_factory.mktemp("torch-moe"))


def test_healthy_moe_run_is_silent_live(worker: StreamSettings, tmp_path: Path) -> None:
    found, replay = live.run_healthy(worker, _paced, HEALTHY_S, tmp_path)
    assert not found, f"moe: {live.summary(found)}; {replay}"
