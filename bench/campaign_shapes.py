"""Offline fault campaign over job shapes the main campaign does not use.

``campaign_offline.py`` runs one shape per size (tp 8 x pp 2 x dp 4 and tp 8
x pp 4 x dp 32): a host is one TP group there, so a slow host is one member
of each DP group. Real jobs use other shapes: TP groups smaller than a host
(several DP members of one group on a host), no pipeline (pp 1, DP traffic
only), deep pipelines. This runs every fault type x seeds on each shape,
and healthy runs, simulated and analyzed in-process, scored as the main
campaign is (``bench/campaign/score.py``), and writes
``bench/results/campaign_shapes.json``. Usage::

    python bench/campaign_shapes.py --seeds 3
    python bench/campaign_shapes.py --shapes 4x4x4 --faults link-flap --seeds 2

Shapes are ``TPxPPxDP`` with 8 GPUs per host (2 per NIC).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign.runner import ALL_FAULTS, RunSpec, run_one  # noqa: E402
from bench.campaign_offline import aggregate, source_commit, write_rows  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "campaign_shapes.json"
SHAPES = "4x4x4,2x4x8,8x1x8,8x2x8"


def _shape(text: str) -> tuple[int, int, int]:
    tp, pp, dp = (int(x) for x in text.split("x"))
    return tp, pp, dp


def per_shape(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-fault aggregates (``campaign_offline.aggregate``) of each shape."""
    shapes = sorted({tuple(r["shape"]) for r in rows})
    out: dict[str, Any] = {}
    for sh in shapes:
        mine = [r for r in rows if tuple(r["shape"]) == sh]
        out["x".join(map(str, sh))] = aggregate(mine)
    return out


def main() -> int:
    """Run the shapes x faults x seeds and write the results."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default=SHAPES, help="comma list of TPxPPxDP")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per fault and shape")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=24.0, help="s per run")
    ap.add_argument("--faults", default="all", help="comma list or 'all'")
    ap.add_argument("--healthy-runs", type=int, default=1, help="per shape")
    ap.add_argument("--healthy-duration", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    faults = list(ALL_FAULTS) if args.faults == "all" else args.faults.split(",")
    specs = [
        RunSpec(f, seed, *_shape(sh), args.duration)
        for seed in range(args.first_seed, args.first_seed + args.seeds)
        for sh in args.shapes.split(",")
        for f in faults
    ] + [
        RunSpec("", 1000 + i, *_shape(sh), args.healthy_duration)
        for i in range(args.healthy_runs)
        for sh in args.shapes.split(",")
    ]
    t0, commit = time.time(), source_commit()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(args.workers) as ex:
        for row in ex.map(run_one, specs):
            rows.append(row)
            d = row["diagnosis"] or {}
            print(
                f"{'x'.join(map(str, row['shape'])):7s} {row['fault']:24s} "
                f"seed {row['seed']:<3d} det={row['detected']!s:5} "
                f"rank={row['rank_ok']!s:5} comp={row['component_ok']!s:5} "
                f"flow={row['flow_ok']!s:5} diag={d.get('rank')}:{d.get('component')}",
                flush=True,
            )
    write_rows(
        args.out,
        rows,
        commit=commit,
        command=" ".join(["python bench/campaign_shapes.py", *sys.argv[1:]]),
        wall_s=round(time.time() - t0, 1),
        seeds_per_fault=args.seeds,
        duration_s=args.duration,
        per_shape=per_shape(rows),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
