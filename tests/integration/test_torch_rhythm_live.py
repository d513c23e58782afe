"""A real rank-0 checkpoint rhythm live: 4 gloo DDP ranks, agent, broker, worker.

Rank 0 of ``tests/unit/torch/ddp_job.py`` sleeps 2.5 s every 10 iterations
(of at least 0.1 s each),
as a rank-0 checkpoint does, while the other ranks wait for it in the next
iteration's bucket all-reduces. Each such pause used to page as a hang (3
``hang`` incidents at 0.99 in a few minutes). The first pause may still page:
nothing tells it from a hang before it resolves (``streams/core/README.md``,
"Stall rhythm"). No later pause may, and the offline analyzer of the same
records reports the pauses as rank 0's cost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mycroft.producers.tracefile import read_records
from mycroft.schemas.records import RootCause
from mycroft.streams.analyze import Replay
from mycroft.streams.core.stall_rhythm import Pause
from mycroft.streams.faust_settings import StreamSettings
from tests.unit.torch import ddp_job, harness, live

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

RUN_S = 55.0
JOB_ARGS = ["--iters", "1000000", "--iter-sleep-s", "0.1"]
RHYTHM = ["--checkpoint-every", "10", "--checkpoint-s", "2.5"]


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamSettings]:
    yield from live.worker(kafka_bootstrap, tmp_path_factory.mktemp("torch-rhythm"))


def _run(s: StreamSettings, tmp: Path) -> tuple[str, list[RootCause]]:
    """Run the job for ``RUN_S``; return its id and the live root causes."""
    job_id = f"torch-rhythm-{time.time_ns() % 10**12}"
    found = live.run_for(s, job_id, ddp_job.launch, [*JOB_ARGS, *RHYTHM], RUN_S, tmp)
    return job_id, found


def _rank0_pauses(
    s: StreamSettings, job_id: str, tmp: Path
) -> tuple[Replay, list[Pause]]:
    """The job's records replayed offline; rank 0's pauses, oldest first."""
    trace = tmp / "job.trace"
    live.record_trace(s, job_id, trace)
    replay = Replay()
    for ts, rec in read_records(trace):
        replay.feed(ts, rec)
    replay.finish()
    rhythm = replay.analyzers[job_id].rhythm
    pauses = [p for (_, h), ps in rhythm.pauses.items() if h == (0,) for p in ps]
    return replay, sorted(pauses, key=lambda p: p.start_ns)


def test_rank0_checkpoints_page_at_most_once_and_are_a_cost(
    worker: StreamSettings, tmp_path: Path
) -> None:
    job_id, found = _run(worker, tmp_path)
    replay, pauses = _rank0_pauses(worker, job_id, tmp_path)
    costs = replay.analyzers[job_id].rhythm.costs()
    rank0 = [c for c in costs if c.holders == (0,)]
    assert rank0 and rank0[0].count >= 3, (costs, harness.logs(tmp_path / "logs"))
    assert 2.0 <= rank0[0].mean_s <= 4.0, rank0
    second = min(p.start_ns for p in pauses if p.recurring)
    late = [r for r in found if r.onset_ns >= second]
    assert not late, f"pages after the rhythm was learned: {live.summary(late)}"
    assert len({r.incident_id for r in found}) <= 1, live.summary(found)
