"""FSDP2 and tensor-parallel faults named live: 4 gloo ranks, agent, broker, worker.

``tests/unit/torch/fsdp_job.py`` trains an MLP under ``fully_shard`` (its
all-gathers and reduce-scatters), ``tp_job.py`` one under
``parallelize_module`` with column- and row-wise parallel layers (DTensor's
functional all-reduces, which only the Flight Recorder poll of
``MYCROFT_TORCH_TRACE=1`` sees). In each, rank 2 straggles in every
backward, stalls in backward for good, or dies there, between one layer's
backward collectives and the next one's; the root-cause topic must name rank
2 and the fault kind (slowdown, hang, hang), and stay silent on a 100 s
healthy run of each.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mycroft.streams.faust_settings import StreamSettings
from tests.unit.torch import fsdp_job, harness, live, tp_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

CULPRIT = 2
JOBS: dict[str, live.Launch] = {"fsdp2": fsdp_job.launch, "tp": tp_job.launch}
SCENARIOS: dict[str, tuple[list[str], str, float]] = {
    # scenario: (job arguments, fault kind named, seconds to wait for it)
    "stall": (["--iters", "400", "--fault-at", "15"], "hang", 60.0),
    "crash": (["--iters", "400", "--fault-at", "15"], "hang", 60.0),
    "straggler": (
        ["--iters", "60", "--fault-at", "15", "--delay-s", "0.4"],
        "slowdown",
        75.0,
    ),
}
HEALTHY_S = 100.0


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamSettings]:
    yield from live.worker(kafka_bootstrap, tmp_path_factory.mktemp("torch-par"))


@pytest.mark.parametrize("scenario", ["stall", "crash", "straggler"])
@pytest.mark.parametrize("job", sorted(JOBS))
def test_fault_named_live(
    worker: StreamSettings,
    tmp_path: Path,
    job: str,
    scenario: str,
) -> None:
    args, kind, timeout_s = SCENARIOS[scenario]
    job_args = [*args, "--scenario", scenario, "--culprit", str(CULPRIT)]
    want = (CULPRIT, kind)
    found = live.run_job_live(worker, JOBS[job], job_args, want, timeout_s, tmp_path)
    assert any(live.named(r, *want) for r in found), (
        f"{job}: wanted rank {CULPRIT} {kind}; root causes {live.summary(found)}\n"
        f"{harness.logs(tmp_path / 'logs')}"
    )


# Last: a worker that lags behind these runs (shared cores) must not delay
# the fault scenarios.
@pytest.mark.parametrize("job", sorted(JOBS))
def test_healthy_run_is_silent(
    worker: StreamSettings, tmp_path: Path, job: str
) -> None:
    found, replay = live.run_healthy(worker, JOBS[job], HEALTHY_S, tmp_path)
    assert not found, f"{job}: {live.summary(found)}; {replay}"
