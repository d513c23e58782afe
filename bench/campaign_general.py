"""Offline fault campaign over simulator behaviours, split into tune and report.

The main campaigns (``campaign_offline.py``, ``campaign_shapes.py``) run the
default simulator: GPipe, 8 GPUs per host, no drift, no noise. This one runs
settings that turn on the opt-in behaviours (``producers/sim/README.md``),
split in two halves that share no setting and no seed:

* **tune**: the settings detection thresholds may be adjusted against;
* **report**: other schedules (1F1B, interleaved 1F1B), the tree
  all-reduce, slot counter semantics and the same as NCCL's profiler
  plugin observes it (``counters="nccl"``), layouts (4 GPUs per host, 1 GPU per
  NIC, TP 2, a pipeline inside a host), channel counts, slot sizes,
  sampling periods, clock drift and noise levels, run only to report.
  Numbers quoted for the analyzer come from this half.

Every fault type x seeds runs on every setting of a half, plus healthy runs;
each run is simulated and analyzed in-process (``mycroft analyze``'s code
path, ``bench/campaign/runner.py``) and scored against the truth outside the
analyzer (``bench/campaign/score.py``). Prints and writes per half: culprit
(rank) and component accuracy over the fault runs, false root causes on the
healthy runs, detection p90; per-fault aggregates go to the JSON. Each fault
run's healthy twin (same setting and seed) is simulated too, and the
accuracy over the runs that cost the job at least one iteration is written
beside the headline (``bench/campaign/effect.py``; every run still counts in
the headline). Usage::

    python bench/campaign_general.py                       # full: >= 30 healthy min
    python bench/campaign_general.py --half tune --seeds 1 --duration 20 \\
        --healthy-runs 1 --healthy-duration 120 --out ..._tune.json  # reduced

Full size: 14 faults x 3 seeds x 15 settings and 2 x 450 s healthy runs per
setting (150 simulated minutes over the 10 report settings).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign.effect import effective, mark, twins  # noqa: E402
from bench.campaign.runner import ALL_FAULTS  # noqa: E402
from bench.campaign.score import score_run  # noqa: E402
from bench.campaign_offline import aggregate, source_commit, write_rows  # noqa: E402
from mycroft.producers.sim.config import (  # noqa: E402
    Hardware,
    Noise,
    SimConfig,
    Workload,
)
from mycroft.producers.sim.engine import simulate  # noqa: E402
from mycroft.producers.sim.faults import parse_spec  # noqa: E402
from mycroft.producers.sim.phases import Phases  # noqa: E402
from mycroft.streams.analyze import Replay, to_json  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "campaign_general.json"

LIGHT = Noise(gc_pauses_per_min=2, proxy_hiccups_per_min=6, wire_bursts_per_min=6)
HEAVY = Noise(
    gc_pauses_per_min=10,
    proxy_hiccups_per_min=30,
    wire_bursts_per_min=30,
    storage_nics=1,
    port_counters_base=3,
)


@dataclasses.dataclass(frozen=True)
class Setting:
    """A named job shape and behaviour set (everything but seed and length)."""

    name: str
    half: str
    tp: int
    pp: int
    dp: int
    hardware: Hardware = Hardware()
    workload: Workload = Workload(micro_batches=4)
    noise: Noise = Noise()
    interval_ms: int = 100
    seed_base: int = 0
    order: str = "tp-dp-pp"
    phases: Phases = Phases()

    def config(self, seed: int, duration_s: float, job: str) -> SimConfig:
        """The simulator config of one run."""
        return SimConfig(
            tp=self.tp,
            pp=self.pp,
            dp=self.dp,
            duration_s=duration_s,
            interval_ms=self.interval_ms,
            seed=self.seed_base + seed,
            job_id=job,
            hardware=self.hardware,
            workload=self.workload,
            noise=self.noise,
            order=self.order,
            phases=self.phases,
        )


SETTINGS: tuple[Setting, ...] = (
    # tune: GPipe, 8 GPUs per host, modest changes from the default.
    Setting("gpipe-8x2x4", "tune", 8, 2, 4, seed_base=0),
    Setting(
        "gpipe-4x2x8-nic1-light",
        "tune",
        4,
        2,
        8,
        Hardware(gpus_per_nic=1, dp_channels=8, chunk_bytes=512 << 10),
        noise=LIGHT,
        interval_ms=50,
        seed_base=0,
    ),
    Setting(
        "gpipe-8x1x8-drift10",
        "tune",
        8,
        1,
        8,
        Hardware(clock_drift_ppm=10, runahead=0.5),
        seed_base=0,
    ),
    Setting(
        "gpipe-8x2x4-ahead3",
        "tune",
        8,
        2,
        4,
        Hardware(runahead_ops=3),
        seed_base=0,
    ),
    Setting(
        "gpipe-4x2x8-slots",
        "tune",
        4,
        2,
        8,
        Hardware(counters="slots", chunk_bytes=1 << 20),
        seed_base=0,
    ),
    # tune: the slots setting as NCCL's profiler plugin observes it (a send's
    # G at most T + 1, its ready data's wait as time: ready_wait_us).
    Setting(
        "gpipe-4x2x8-nccl",
        "tune",
        4,
        2,
        8,
        Hardware(counters="nccl", chunk_bytes=1 << 20),
        seed_base=0,
    ),
    # report: 1F1B, 4-GPU hosts, TP 2, many channels, large slots, 20 ms
    # sampling, drift tens of ppm, heavy noise; seeds disjoint from tune.
    Setting(
        "1f1b-2x4x4-h4-slots",
        "report",
        2,
        4,
        4,
        Hardware(
            gpus_per_host=4, dp_channels=16, chunk_bytes=2 << 20, counters="slots"
        ),
        Workload(micro_batches=8, schedule="1f1b"),
        LIGHT,
        seed_base=500,
    ),
    # report: the slots setting above as NCCL's profiler plugin observes it.
    Setting(
        "1f1b-2x4x4-h4-nccl",
        "report",
        2,
        4,
        4,
        Hardware(gpus_per_host=4, dp_channels=16, chunk_bytes=2 << 20, counters="nccl"),
        Workload(micro_batches=8, schedule="1f1b"),
        LIGHT,
        seed_base=500,
    ),
    # report: heavy noise (proxy hiccups every 2 s) on 1-GPU NICs under
    # credits, as a producer that shows every slot reports it and as the
    # plugin observes it.
    Setting(
        "gpipe-2x2x8-h4-nic1-heavy-slots",
        "report",
        2,
        2,
        8,
        Hardware(gpus_per_host=4, gpus_per_nic=1, runahead=0.3, counters="slots"),
        noise=HEAVY,
        seed_base=500,
    ),
    Setting(
        "gpipe-2x2x8-h4-nic1-heavy-nccl",
        "report",
        2,
        2,
        8,
        Hardware(gpus_per_host=4, gpus_per_nic=1, runahead=0.3, counters="nccl"),
        noise=HEAVY,
        seed_base=500,
    ),
    Setting(
        "1f1b-4x4x4-drift40-heavy",
        "report",
        4,
        4,
        4,
        Hardware(clock_drift_ppm=40, tp_channels=2, chunk_bytes=256 << 10),
        Workload(micro_batches=8, schedule="1f1b"),
        HEAVY,
        interval_ms=20,
        seed_base=500,
    ),
    Setting(
        "gpipe-2x2x8-h4-nic1-heavy",
        "report",
        2,
        2,
        8,
        Hardware(gpus_per_host=4, gpus_per_nic=1, runahead=0.3),
        noise=HEAVY,
        seed_base=500,
    ),
    # report: double-binary-tree all-reduces (TP, and DP gradients in one
    # all-reduce across hosts) with the CPU 4 ops ahead.
    Setting(
        "tree-8x2x4-dpar-ahead4",
        "report",
        8,
        2,
        4,
        Hardware(allreduce="tree", runahead_ops=4),
        Workload(micro_batches=4, dp_allreduce=True),
        LIGHT,
        seed_base=500,
    ),
    # report: MoE, each TP group expert-parallel: a dispatch and a combine
    # all-to-all after every TP all-reduce, the combine's per-rank sizes
    # uneven (token imbalance drawn per call): not a size mismatch.
    Setting(
        "moe-8x2x4-light",
        "report",
        8,
        2,
        4,
        workload=Workload(micro_batches=4, moe_bytes=16 << 20),
        noise=LIGHT,
        seed_base=500,
    ),
    # report: interleaved 1F1B (2 chunks) with each pipeline inside a host.
    Setting(
        "ilv1f1b-2x4x4-inhost",
        "report",
        2,
        4,
        4,
        workload=Workload(
            micro_batches=8, schedule="interleaved-1f1b", virtual_stages=2
        ),
        noise=LIGHT,
        seed_base=500,
        order="tp-pp-dp",
    ),
    # report: the training loop's own rhythm (producers/sim/phases.py):
    # rank 0 checkpoints 3 s every 20 s while the others wait for it, an
    # evaluation phase every 25 s, a slower first iteration after each.
    Setting(
        "gpipe-8x2x4-rhythm",
        "report",
        8,
        2,
        4,
        noise=LIGHT,
        seed_base=500,
        phases=Phases(20.0, 3.0, "rank0", 25.0, 4, 1.5),
    ),
)


def run_setting(args: tuple[Setting, str, int, float]) -> dict[str, Any]:
    """Simulate, analyze and score one run of ``setting`` (fault ``""`` =
    healthy); the truth reaches only the scorer, after the analysis."""
    setting, fault, seed, duration_s = args
    cfg = setting.config(seed, duration_s, f"gen-{fault or 'healthy'}-{seed}")
    specs = [parse_spec(fault)] if fault else []
    replay = Replay()
    t0 = time.perf_counter()
    result = simulate(cfg, specs, replay)
    anomalies, causes = replay.finish()
    wall = time.perf_counter() - t0
    analysis = to_json(anomalies, causes, replay.first_resolved_ns)
    scored = score_run(result.truth(), analysis)
    return scored | {
        "setting": setting.name,
        "half": setting.half,
        "seed": cfg.seed,
        "ranks": cfg.ranks,
        "shape": [cfg.tp, cfg.pp, cfg.dp],
        "duration_s": duration_s,
        "wall_s": round(wall, 3),
        "noise_events": len(result.noise_events),
        "iterations": result.iterations,
    }


def _p90(xs: list[float]) -> float | None:
    return round(float(np.percentile(xs, 90)), 3) if xs else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Headline numbers of one half's rows."""
    faulty = [r for r in rows if r["fault"] != "healthy"]
    healthy = [r for r in rows if r["fault"] == "healthy"]
    det = [r["detection_latency_s"] for r in faulty if r["detected"]]
    n = max(len(faulty), 1)
    return {
        "fault_runs": len(faulty),
        "detection_rate": round(len(det) / n, 3),
        "culprit_accuracy": round(sum(bool(r["rank_ok"]) for r in faulty) / n, 3),
        "component_accuracy": round(
            sum(bool(r["component_ok"]) for r in faulty) / n, 3
        ),
        "detection_p90_s": _p90(det),
        "healthy_runs": len(healthy),
        "healthy_minutes": round(sum(r["duration_s"] for r in healthy) / 60, 2),
        "false_root_causes_healthy": sum(r["false_root_causes"] for r in healthy),
        "false_root_causes_before_onset": sum(r["false_root_causes"] for r in faulty),
    } | effective(faulty)


def main() -> int:
    """Run both halves and write the results."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, default=3, help="seeds per fault and setting")
    ap.add_argument(
        "--first-seed",
        type=int,
        default=1,
        help="first seed (added to the setting's seed base; the report half's "
        "base is 500, so tune seeds below 500 stay disjoint from it)",
    )
    ap.add_argument("--duration", type=float, default=24.0, help="s per fault run")
    ap.add_argument("--faults", default="all", help="comma list, 'all' or 'none'")
    ap.add_argument("--healthy-runs", type=int, default=2, help="per setting")
    ap.add_argument("--healthy-duration", type=float, default=450.0)
    ap.add_argument("--settings", default="all", help="comma list of names or 'all'")
    ap.add_argument("--half", choices=("tune", "report", "all"), default="all")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    faults = (
        list(ALL_FAULTS)
        if args.faults == "all"
        else []
        if args.faults == "none"
        else args.faults.split(",")
    )
    chosen = [
        s
        for s in SETTINGS
        if (args.settings == "all" or s.name in args.settings.split(","))
        and args.half in ("all", s.half)
    ]
    jobs = [
        (s, f, seed, args.duration)
        for s in chosen
        for seed in range(args.first_seed, args.first_seed + args.seeds)
        for f in faults
    ] + [
        (s, "", 1000 + i, args.healthy_duration)
        for s in chosen
        for i in range(args.healthy_runs)
    ]
    t0, commit = time.time(), source_commit()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(args.workers) as ex:
        twin = twins(ex, [(s, seed, d) for s, f, seed, d in jobs if f])
        for row in ex.map(run_setting, jobs):
            rows.append(row)
            print(
                f"{row['half']:6s} {row['setting']:26s} {row['fault']:24s} "
                f"seed {row['seed']:<4d} det={row['detected']!s:5} "
                f"rank={row['rank_ok']!s:5} comp={row['component_ok']!s:5} "
                f"false={row['false_root_causes']} wall={row['wall_s']}s",
                flush=True,
            )
    mark(rows, twin)
    halves = {
        h: summary([r for r in rows if r["half"] == h])
        for h in ("tune", "report")
        if args.half in ("all", h)
    }
    for h, s in halves.items():
        print(h, s)
    write_rows(
        args.out,
        rows,
        commit=commit,
        command=" ".join(["python bench/campaign_general.py", *sys.argv[1:]]),
        wall_s=round(time.time() - t0, 1),
        settings={s.name: {"half": s.half, "config": repr(s)} for s in chosen},
        halves=halves,
        per_setting={
            s.name: aggregate([r for r in rows if r["setting"] == s.name])
            for s in chosen
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
