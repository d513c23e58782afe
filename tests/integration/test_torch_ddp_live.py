"""DDP faults named live: 4 gloo ranks of a DDP job, agent, broker, worker.

The ranks of ``tests/unit/torch/ddp_job.py`` call no collective themselves:
every op on the ring is one of DDP's (bucket all-reduces, set-up broadcasts)
and comes from the Flight Recorder poll of ``MYCROFT_TORCH_TRACE=1``. Each
fault is injected in the culprit's backward, after its later layers' bucket
was issued and before its first layer's: a straggler that sleeps there every
step, a rank that stalls there for good, a rank that dies there. The
root-cause topic must name the culprit rank and fault kind, and stay silent
on a 100 s healthy run (with ``test_torch_parallel_live.py``'s FSDP2 and TP
runs, 5 minutes of healthy training).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mycroft.streams.faust_settings import StreamSettings
from tests.unit.torch import ddp_job, harness, live

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

CULPRIT = 2
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
    yield from live.worker(kafka_bootstrap, tmp_path_factory.mktemp("torch-ddp"))


@pytest.mark.parametrize("scenario", ["stall", "crash", "straggler"])
def test_ddp_fault_named_live(
    worker: StreamSettings, tmp_path: Path, scenario: str
) -> None:
    args, kind, timeout_s = SCENARIOS[scenario]
    job_args = [*args, "--scenario", scenario, "--culprit", str(CULPRIT)]
    want = (CULPRIT, kind)
    found = live.run_job_live(
        worker, ddp_job.launch, job_args, want, timeout_s, tmp_path
    )
    assert any(live.named(r, *want) for r in found), (
        f"wanted rank {CULPRIT} {kind}; root causes {live.summary(found)}\n"
        f"{harness.logs(tmp_path / 'logs')}"
    )


# Last: a worker that lags behind this run (shared cores) must not delay the
# fault scenarios.
def test_ddp_healthy_run_is_silent(worker: StreamSettings, tmp_path: Path) -> None:
    found, replay = live.run_healthy(worker, ddp_job.launch, HEALTHY_S, tmp_path)
    assert not found, f"{live.summary(found)}; {replay}"
