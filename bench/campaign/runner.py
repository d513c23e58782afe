"""One campaign run: simulate in-process, analyze in-process, score outside.

The simulator writes its records straight into a ``Replay`` (the class that
``mycroft analyze`` drives), so no trace file is written and the analyzer
runs exactly the offline code path. The truth document is obtained from the
simulator *after* the analysis finished and is only handed to the scorer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bench.campaign.score import score_run
from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import FAULTS, parse_spec
from mycroft.streams.analyze import Replay, to_json

ALL_FAULTS: tuple[str, ...] = tuple(FAULTS)
"""Every fault type of the simulator (`producers/sim/faults.py`)."""


@dataclass(frozen=True)
class RunSpec:
    """One campaign run. ``fault`` is ``""`` for a healthy run."""

    fault: str
    seed: int
    tp: int = 8
    pp: int = 2
    dp: int = 4
    duration_s: float = 30.0

    @property
    def ranks(self) -> int:
        """World size."""
        return self.tp * self.pp * self.dp


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Simulate, analyze and score one run; return the score plus timings.

    The fault's rank, onset and severity are left to the simulator, which
    draws them from the seed (``parse_spec(name)`` with no keys).
    """
    cfg = SimConfig(
        tp=spec.tp,
        pp=spec.pp,
        dp=spec.dp,
        duration_s=spec.duration_s,
        seed=spec.seed,
        job_id=f"camp-{spec.fault or 'healthy'}-{spec.seed}",
    )
    specs = [parse_spec(spec.fault)] if spec.fault else []
    replay = Replay()
    t0 = time.perf_counter()
    result = simulate(cfg, specs, replay)
    anomalies, causes = replay.finish()
    wall = time.perf_counter() - t0
    analysis = to_json(anomalies, causes, replay.first_resolved_ns)
    truth = result.truth()  # only now, and only for the scorer
    scored = score_run(truth, analysis)
    evals = sorted(replay.eval_wall_s)
    fault_truth = truth["faults"][0] if truth["faults"] else None
    return scored | {
        "seed": spec.seed,
        "ranks": spec.ranks,
        "shape": [spec.tp, spec.pp, spec.dp],
        "duration_s": spec.duration_s,
        "wall_s": round(wall, 3),
        "eval_s_sum": round(sum(evals), 4),
        "eval_ms_p50": round(1e3 * evals[len(evals) // 2], 3) if evals else None,
        "eval_ms_max": round(1e3 * evals[-1], 3) if evals else None,
        "evals": len(evals),
        "truth": (
            {
                k: fault_truth.get(k)
                for k in ("rank", "ranks", "at_s", "severity", "params")
            }
            if fault_truth
            else None
        ),
        "n_anomalies": len(analysis["anomalies"]),
        "n_incidents": len({r["incident_id"] for r in analysis["root_causes"]}),
    }
