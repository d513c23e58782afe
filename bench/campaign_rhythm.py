"""Healthy training rhythm against the stall policy, and real hangs within it.

Runs jobs whose training loop checkpoints (rank 0 alone, or every rank),
evaluates, restarts slowly after a pause and collects garbage
(``producers/sim/phases.py``), healthy and with a ``gpu-hang`` after the
rhythm recurred, simulated and analyzed in-process as ``mycroft analyze``
does, scored outside (``bench/campaign/score.py``), and writes
``bench/results/campaign_rhythm.json``. Usage::

    python bench/campaign_rhythm.py --seeds 3 --duration 60

A rank-0 checkpoint longer than the hang threshold pages once, at its
first pause (nothing tells it from a hang before it resolves): the healthy
rows count those apart (``first_pause_pages``) from every later root cause
(``false_root_causes_after_first``), which must be 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign.score import score_run  # noqa: E402
from mycroft.producers.sim.config import Noise, SimConfig, Workload  # noqa: E402
from mycroft.producers.sim.engine import simulate  # noqa: E402
from mycroft.producers.sim.faults import parse_spec  # noqa: E402
from mycroft.producers.sim.phases import Phases  # noqa: E402
from mycroft.streams.analyze import Replay, to_json  # noqa: E402
from mycroft.streams.pause_report import job_costs, pauses_json  # noqa: E402

CHECKPOINT_EVERY_S = 20.0
SETTINGS: dict[str, tuple[tuple[int, int, int], Workload, Phases]] = {
    "gpipe-8x1x4-ckpt-rank0": (
        (8, 1, 4),
        Workload(micro_batches=4),
        Phases(CHECKPOINT_EVERY_S, 3.0, "rank0", 25.0, 4, 1.5),
    ),
    "1f1b-4x2x4-ckpt-all": (
        (4, 2, 4),
        Workload(micro_batches=8, schedule="1f1b"),
        Phases(CHECKPOINT_EVERY_S, 3.0, "all", 25.0, 4, 1.5),
    ),
    "1f1b-4x2x4-ckpt-rank0": (
        (4, 2, 4),
        Workload(micro_batches=8, schedule="1f1b"),
        Phases(CHECKPOINT_EVERY_S, 3.0, "rank0", 25.0, 4, 1.5),
    ),
}
"""Shape (tp, pp, dp), workload and rhythm of each setting; GC pauses on all."""


def run(name: str, seed: int, duration_s: float, fault: str) -> dict[str, Any]:
    """Simulate, analyze and score one run."""
    (tp, pp, dp), wl, phases = SETTINGS[name]
    cfg = SimConfig(
        tp=tp,
        pp=pp,
        dp=dp,
        duration_s=duration_s,
        seed=seed,
        job_id=f"rhythm-{name}-{seed}",
        workload=wl,
        noise=Noise(gc_pauses_per_min=6.0),
        phases=phases,
    )
    replay = Replay()
    t0 = time.perf_counter()
    result = simulate(cfg, [parse_spec(fault)] if fault else [], replay)
    anomalies, causes = replay.finish()
    wall = time.perf_counter() - t0
    analysis = to_json(anomalies, causes, replay.first_resolved_ns)
    truth = result.truth()  # only now, and only for the scorer
    scored = score_run(truth, analysis)
    first_pause = CHECKPOINT_EVERY_S + cfg.start_ns / 1e9
    onsets = sorted({r["onset_s"] for r in analysis["root_causes"]})
    first = [t for t in onsets if t < first_pause + phases.checkpoint_s]
    return scored | {
        "setting": name,
        "seed": seed,
        "fault": fault or "healthy",
        "wall_s": round(wall, 2),
        "first_pause_pages": len(first) if not fault else None,
        "false_root_causes_after_first": len(onsets) - len(first)
        if not fault
        else None,
        "pauses": pauses_json(job_costs(replay.analyzers)),
    }


def main() -> int:
    """Run every setting x seeds, healthy and with a late gpu-hang."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument(
        "--out", type=Path, default=Path("bench/results/campaign_rhythm.json")
    )
    args = ap.parse_args()
    hang = f"gpu-hang:at={args.duration - 8:.0f}"
    rows = [
        run(name, seed, args.duration, fault)
        for name in SETTINGS
        for seed in range(1, args.seeds + 1)
        for fault in ("", hang)
    ]
    for r in rows:
        print(
            r["setting"], r["seed"], r["fault"],
            "latency", r.get("detection_latency_s"),
            "first-pause pages", r["first_pause_pages"],
            "false after first", r["false_root_causes_after_first"],
            "false", r.get("false_root_causes"),
            [p["summary"] for p in r["pauses"]][:1],
        )  # fmt: skip
    args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
