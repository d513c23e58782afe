"""A fault run's effect on the job is measured against its healthy twin
(``bench/campaign/effect.py``): the simulator draws each purpose from its
own random stream, so the twin differs from the run by the fault alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.campaign.effect import effective, iterations, mark, twins
from mycroft.producers.sim.config import SimConfig


class _Small:
    name = "small"
    seed_base = 100

    def config(self, seed: int, duration_s: float, job_id: str) -> SimConfig:
        return SimConfig(
            tp=2,
            pp=2,
            dp=2,
            duration_s=duration_s,
            seed=self.seed_base + seed,
            job_id=job_id,
        )


SMALL = _Small()


def _row(fault: str, n: int, *, ok: bool) -> dict[str, Any]:
    return {
        "setting": "small",
        "seed": 1,
        "fault": fault,
        "iterations": n,
        "rank_ok": ok,
        "component_ok": ok,
    }


def test_the_twin_is_the_run_without_its_fault() -> None:
    with ThreadPoolExecutor(2) as ex:
        got = twins(ex, [(SMALL, 1, 6.0), (SMALL, 1, 6.0)])
    # One twin per run, keyed by the simulator's seed as the rows carry it.
    assert list(got) == [("small", 101)]
    twin = got["small", 101]
    assert twin == iterations((SMALL, 1, 6.0, ""))
    assert iterations((SMALL, 1, 6.0, "gpu-hang:rank=1,at=2")) < twin


def test_effective_accuracy_leaves_out_runs_that_cost_no_iteration() -> None:
    rows = [
        _row("gpu-hang", 3, ok=True),
        _row("pcie-downgrade", 9, ok=False),
        _row("port-flap", 10, ok=False),
        _row("healthy", 10, ok=True),
    ]
    mark(rows, {("small", 1): 10})
    assert [r.get("iterations_lost") for r in rows] == [7, 1, 0, None]
    assert [r.get("effect") for r in rows] == [True, True, False, None]
    got = effective(rows[:3])
    assert got["effective_fault_runs"] == 2
    assert got["culprit_accuracy_effective"] == 0.5
    assert got["no_effect_runs"] == {"port-flap": 1}
