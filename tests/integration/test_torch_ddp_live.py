"""DDP faults named live: 4 gloo ranks of a DDP job, agent, broker, worker.

The ranks of ``tests/unit/torch/ddp_job.py`` call no collective themselves:
every op on the ring is one of DDP's (bucket all-reduces, set-up broadcasts)
and comes from the Flight Recorder poll of ``MYCROFT_TORCH_TRACE=1``. Each
fault is injected in the culprit's backward, after its later layers' bucket
was issued and before its first layer's: a straggler that sleeps there every
step, a rank that stalls there for good, a rank that dies there. The
root-cause topic must name the culprit rank and fault kind, and stay silent
on a healthy run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mycroft.schemas.records import RootCause
from mycroft.streams.faust_settings import StreamSettings
from tests.agent_process import stop_agent
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


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamSettings]:
    yield from live.worker(kafka_bootstrap, tmp_path_factory.mktemp("torch-ddp"))


def run_ddp_live(
    s: StreamSettings, scenario: str, tmp: Path
) -> tuple[list[RootCause], str]:
    """Run ``scenario`` until the culprit is named or the wait ends."""
    args, kind, timeout_s = SCENARIOS[scenario]
    job_id = f"torch-ddp-{scenario}-{time.time_ns() % 10**9}"
    (tmp / "rings").mkdir()
    poll = live.root_cause_poller(s)
    agent = live.start_agent(s, job_id, tmp)
    found: list[RootCause] = []
    env = harness.traced_env(tmp / "rings")
    job_args = [*args, "--scenario", scenario, "--culprit", str(CULPRIT)]
    procs = ddp_job.launch(job_args, 4, env, tmp / "logs")
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [r for r in poll() if r.job_id == job_id]
            if any(live.named(r, CULPRIT, kind) for r in found):
                break
    finally:
        harness.job().stop(procs)
        stop_agent(agent, tmp / "agent.log")
    return found, kind


@pytest.mark.parametrize("scenario", ["stall", "crash", "straggler"])
def test_ddp_fault_named_live(
    worker: StreamSettings, tmp_path: Path, scenario: str
) -> None:
    found, kind = run_ddp_live(worker, scenario, tmp_path)
    assert any(live.named(r, CULPRIT, kind) for r in found), (
        f"wanted rank {CULPRIT} {kind}; root causes {live.summary(found)}\n"
        f"{harness.logs(tmp_path / 'logs')}"
    )


HEALTHY_S = 45.0


# Last: a worker that lags behind this run (shared cores) must not delay the
# fault scenarios.
def test_ddp_healthy_run_is_silent(worker: StreamSettings, tmp_path: Path) -> None:
    job_id = f"torch-ddp-none-{time.time_ns() % 10**9}"
    (tmp_path / "rings").mkdir()
    poll = live.root_cause_poller(worker)
    agent = live.start_agent(worker, job_id, tmp_path)
    env = harness.traced_env(tmp_path / "rings")
    procs = ddp_job.launch(["--iters", "100000"], 4, env, tmp_path / "logs")
    found: list[RootCause] = []
    try:
        deadline = time.monotonic() + HEALTHY_S
        while time.monotonic() < deadline:
            found = [r for r in poll() if r.job_id == job_id]
            assert all(p.poll() is None for p in procs), harness.logs(tmp_path / "logs")
    finally:
        stop_agent(agent, tmp_path / "agent.log")  # first: the stop is no fault
        harness.job().stop(procs)
    assert not found, live.summary(found)
