"""Offline fault campaign: every fault type x seeds, simulated and analyzed
in-process (the ``mycroft analyze`` code path), scored against the truth
outside the analyzer (``bench/campaign/score.py``).

Writes ``bench/results/campaign_offline.json`` (per-run rows and per-fault
aggregates per job size) and ``bench/results/campaign_offline_cdf.png``, or
``--out PATH`` and the figure next to it (experiments that must not touch the
published results).
Each ``--size`` part is merged into the existing JSON, so 64 and 1,024 ranks
can be run separately. Usage::

    python bench/campaign_offline.py --size 64 --seeds 10 --healthy-runs 4
    python bench/campaign_offline.py --size 1024 --seeds 1 --healthy-runs 1

Fault rank, onset (30-50 % of the run) and severity are drawn by the
simulator from the seed; nothing is hand-picked.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign.runner import ALL_FAULTS, RunSpec, run_one  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "campaign_offline.json"
PNG = RESULTS / "campaign_offline_cdf.png"
SHAPES = {64: (8, 2, 4), 1024: (8, 4, 32)}
HANG_KINDS = ("hang", "mismatch")


def source_commit() -> str:
    """The measured source: the checkout's commit (short hash, "+changes" when
    tracked files other than ``bench/results/`` differ from it), or
    ``"unknown"`` outside a git checkout. Results are left out: a part saves
    them after every run, and they are not what is measured."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short=10", "HEAD")
        dirty = git(
            "status", "--porcelain", "--untracked-files=no", "--", ".",
            ":(exclude)bench/results",
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def cost_args(doc: str | None, out: Path, repeat: int) -> argparse.ArgumentParser:
    """The arguments of a per-size cost benchmark: ``--sizes``, ``--repeat``
    and ``--out`` (add the benchmark's own to the parser returned)."""
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", default="64,1024")
    p.add_argument("--repeat", type=int, default=repeat)
    p.add_argument("--out", type=Path, default=out)
    return p


def write_rows(out: Path, rows: list[dict[str, Any]], **fields: Any) -> None:
    """Write a benchmark's ``rows`` to ``out`` as JSON, with the measured
    commit, ``fields`` and the machine's CPU count."""
    doc = {"commit": source_commit(), **fields, "cpus": os.cpu_count(), "rows": rows}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


def _seeds_per_fault(rows: list[dict[str, Any]]) -> int | str:
    """Runs per fault type: a number, or ``"min-max"`` when they differ."""
    faults = {r["fault"] for r in rows} - {"healthy"}
    counts = sorted({sum(r["fault"] == f for r in rows) for f in faults}) or [0]
    return counts[0] if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 3) if xs else None


def _rate(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r[key] is not None]
    return round(sum(map(bool, vals)) / len(vals), 3) if vals else None


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-fault aggregates of scored runs (see score.py for the rules)."""
    out: dict[str, Any] = {}
    for fault in sorted({r["fault"] for r in rows}):
        rs = [r for r in rows if r["fault"] == fault]
        if fault == "healthy":
            out[fault] = {
                "n": len(rs),
                "simulated_minutes": round(sum(r["duration_s"] for r in rs) / 60, 2),
                "false_root_causes": sum(r["false_root_causes"] for r in rs),
                "false_anomalies": sum(r["false_anomalies"] for r in rs),
            }
            continue
        det = [r["detection_latency_s"] for r in rs if r["detected"]]
        rca = [
            r["rca_after_detection_s"]
            for r in rs
            if r["rca_after_detection_s"] is not None
        ]
        out[fault] = {
            "n": len(rs),
            "detection_rate": round(len(det) / len(rs), 3),
            "detection_p50_s": _pct(det, 50),
            "detection_p90_s": _pct(det, 90),
            "detection_max_s": _pct(det, 100),
            "rca_after_detection_p50_s": _pct(rca, 50),
            "rca_after_detection_p90_s": _pct(rca, 90),
            "rca_after_detection_max_s": _pct(rca, 100),
            "rank_accuracy": round(sum(r["rank_ok"] for r in rs) / len(rs), 3),
            "component_accuracy": round(
                sum(r["component_ok"] for r in rs) / len(rs), 3
            ),
            "kind_accuracy": round(sum(r["kind_ok"] for r in rs) / len(rs), 3),
            "flow_accuracy": _rate(rs, "flow_ok"),
            "false_root_causes": sum(r["false_root_causes"] for r in rs),
        }
    return out


def timing(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Analyzer evaluate() cost for this job size (wall, this machine)."""
    p50 = [r["eval_ms_p50"] for r in rows if r["eval_ms_p50"] is not None]
    mx = [r["eval_ms_max"] for r in rows if r["eval_ms_max"] is not None]
    return {
        "evaluate_ms_p50": _pct(p50, 50),
        "evaluate_ms_max": max(mx) if mx else None,
        "run_wall_s_p50": _pct([r["wall_s"] for r in rows], 50),
    }


def plot(doc: dict[str, Any], png: Path = PNG) -> None:
    """Detection and RCA latency CDFs, hang vs slowdown, every size."""
    import matplotlib  # noqa: PLC0415 - optional, only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for size, part in sorted(doc["sizes"].items()):
        for group in ("hang", "slowdown"):
            rows = [
                r
                for r in part["runs"]
                if r["fault"] != "healthy"
                and (r["kind_truth"] in HANG_KINDS) == (group == "hang")
            ]
            for ax, key in zip(
                axes, ("detection_latency_s", "rca_after_detection_s"), strict=True
            ):
                xs = sorted(r[key] for r in rows if r[key] is not None)
                if xs:
                    ys = np.arange(1, len(xs) + 1) / len(rows)
                    ax.step(xs, ys, where="post", label=f"{group}, {size} ranks")
    for ax, title in zip(
        axes, ("detection latency (s)", "root cause after detection (s)"), strict=True
    ):
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of faulty runs")
        ax.set_ylim(0, 1.02)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def fault_duration(rows: list[dict[str, Any]], default: float) -> float:
    """The trace length of the part's fault runs (an ``--append`` of healthy
    runs alone keeps the faults' length), ``default`` if they differ."""
    lengths = {r["duration_s"] for r in rows if r["fault"] != "healthy"}
    return float(lengths.pop()) if len(lengths) == 1 else default


def _save(  # noqa: PLR0913, PLR0917 - private helper of main
    out: Path,
    doc: dict[str, Any],
    args: argparse.Namespace,
    old: dict[str, Any] | None,
    rows: list[dict[str, Any]],
    done: tuple[int, int],
    t0: float,
    commit: str,
) -> None:
    """Write this size's part of ``doc``: ``rows``, plus with ``--append``
    the ``old`` part's runs of other (fault, seed) pairs. ``commit`` is the
    source measured, taken once when the part started."""
    tp, pp, dp = SHAPES[args.size]
    doc["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "workers": args.workers,
    }
    doc["rules"] = "see bench/campaign/score.py (module docstring)"
    command = " ".join(["python bench/campaign_offline.py", *sys.argv[1:]])
    wall = round(time.time() - t0, 1)
    if old is not None:  # the same (fault, seed) measured again replaces the old run
        again = {(r["fault"], r["seed"]) for r in rows}
        rows = [r for r in old["runs"] if (r["fault"], r["seed"]) not in again] + rows
        command = f"{old.get('command', '(command not recorded)')}; {command}"
        commit = f"{old.get('commit', 'not recorded')}, {commit}"
        wall = round(old["wall_s"] + wall, 1)
    part = {
        "command": command,
        "commit": commit,
        "shape": {"tp": tp, "pp": pp, "dp": dp},
        "seeds_per_fault": _seeds_per_fault(rows),
        "duration_s": fault_duration(rows, args.duration),
        "workers": args.workers,
        "wall_s": wall,
        "per_fault": aggregate(rows),
        "timing": timing(rows),
        "runs": rows,
    }
    if done[0] < done[1]:
        part["done"] = f"{done[0]} of {done[1]} runs of the last command"
    doc["sizes"][str(args.size)] = part
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def main() -> int:
    """Run one job size's part of the campaign and merge it into the JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, choices=sorted(SHAPES), default=64)
    ap.add_argument("--seeds", type=int, default=10, help="seeds per fault")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=30.0, help="s per run")
    ap.add_argument("--healthy-runs", type=int, default=4)
    ap.add_argument("--healthy-duration", type=float, default=60.0)
    ap.add_argument("--faults", default="all", help="comma list or 'all'")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--append",
        action="store_true",
        help="add these runs to the size part already in --out (a run of the "
        "same fault and seed replaces the old one) instead of replacing the part",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=OUT,
        help="JSON to merge into (the figure goes next to it, .png); "
        "default bench/results/campaign_offline.json",
    )
    args = ap.parse_args()
    out: Path = args.out
    png = PNG if out == OUT else out.with_suffix(".png")
    tp, pp, dp = SHAPES[args.size]
    faults = list(ALL_FAULTS) if args.faults == "all" else args.faults.split(",")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    healthy = [
        RunSpec("", 1000 + i, tp, pp, dp, args.healthy_duration)
        for i in range(args.healthy_runs)
    ]
    # Healthy runs are spread among the seeds, so a part stopped early (rows
    # are saved as they finish) has some of each.
    specs: list[RunSpec] = []
    for n, seed in enumerate(seeds):
        specs += [RunSpec(f, seed, tp, pp, dp, args.duration) for f in faults]
        specs += healthy[
            n * len(healthy) // len(seeds) : (n + 1) * len(healthy) // len(seeds)
        ]
    if not seeds:
        specs = healthy
    t0, commit = time.time(), source_commit()
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"sizes": {}}
    old = doc["sizes"].get(str(args.size)) if args.append else None
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(args.workers) as ex:
        for spec, row in zip(specs, ex.map(run_one, specs), strict=True):
            from mycroft.producers.sim.faults import FAULTS  # noqa: PLC0415

            row["kind_truth"] = FAULTS[spec.fault].kind if spec.fault else None
            rows.append(row)
            d = row["diagnosis"] or {}
            print(
                f"{row['fault']:24s} seed {spec.seed:<5d} det={row['detected']!s:5} "
                f"rank={row['rank_ok']!s:5} comp={row['component_ok']!s:5} "
                f"flow={row['flow_ok']!s:5} fp={row['false_root_causes']} "
                f"diag={d.get('rank')}:{d.get('component')} "
                f"wall={row['wall_s']:.1f}s",
                flush=True,
            )
            # Saved after every run: a part stopped half way keeps what it
            # measured (``done`` says how much of the part that is).
            _save(out, doc, args, old, rows, (len(rows), len(specs)), t0, commit)
    plot(doc, png)
    print(json.dumps(doc["sizes"][str(args.size)]["per_fault"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
