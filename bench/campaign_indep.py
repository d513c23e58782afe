"""Fault campaign over the independent trace generator, split into tune and report.

The indep world (``../shared/worlds/indep``, its README) is a second trace
generator with its own model of NCCL and Megatron. Its ``scenarios.tsv`` (fixed
seeds and shapes) is the **report** half: numbers quoted for the analyzer come
from it, and its runs are read only to diagnose a miss, never to pick a
constant. The **tune** half (``TUNE`` below) uses other seeds, lets the
generator draw the rest of the job from the seed (layout, schedule, channels,
slots, noise) on 32 or 64 ranks, and draws the faulty rank and the onset too.

Each run is generated, analyzed with ``mycroft analyze TRACE --json`` and
scored by the world's own ``run_all.run_one``/``score.py`` (the analyzer never
sees the truth file). Writes ``bench/results/campaign_indep_<half>.json`` with
per-run rows and the summary: culprit and component accuracy over the fault
runs, false root causes on the healthy runs, incidents opened before a fault's
onset, detection latency p50/p90. Usage::

    python bench/campaign_indep.py --half tune --jobs 2
    python bench/campaign_indep.py --half report --only healthy,gpu-hang
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORLD = ROOT.parent / "shared" / "worlds" / "indep"
RESULTS = ROOT / "bench" / "results"

Scenario = tuple[str, int, str, str]  # name, seed, job spec, fault spec

# fault spec without rank/at: the generator draws both from the seed
_TUNE_FAULTS = (
    "gpu-hang:mode=compute",
    "gpu-hang:mode=dp",
    "gpu-hang:mode=tp",
    "host-stall",
    "host-stall:duration=8",
    "process-crash:shape=vanish",
    "process-crash:shape=frozen",
    "nic-down",
    "nic-bandwidth",
    "gpu-power-cap",
    "link-flap",
    "collective-mismatch:role=dp,factor=2",
    "collective-mismatch:role=tp,factor=0.5",
    "pcie-downgrade:rate=0.25",
    "proxy-delay:mode=send",
    "proxy-delay:mode=all",
)
_TUNE_WORLDS = (32, 64)
_TUNE_HEALTHY = 4


def tune_scenarios(seeds: int, seed_base: int) -> list[Scenario]:
    """The tune half: every fault x ``seeds`` seeds, plus healthy runs."""
    out: list[Scenario] = []
    for i, fault in enumerate(_TUNE_FAULTS):
        for k in range(seeds):
            seed = seed_base + 100 * k + i
            world = _TUNE_WORLDS[(i + k) % len(_TUNE_WORLDS)]
            tag = fault.replace(":", "-").replace("=", "").replace(",", "-")
            out.append((f"t-{tag}-s{seed}", seed, f"world={world},duration=30", fault))
    for k in range(_TUNE_HEALTHY):
        seed = seed_base + 90 + k
        world = _TUNE_WORLDS[k % len(_TUNE_WORLDS)]
        out.append((f"t-healthy-s{seed}", seed, f"world={world},duration=45", "none"))
    return out


def _world_modules(world: Path) -> Any:
    """The world's ``run_all`` module (its scenario reader and run driver)."""
    if not (world / "run_all.py").exists():
        raise SystemExit(f"no indep world at {world}; pass --world DIR")
    sys.path.insert(0, str(world))
    import run_all  # noqa: PLC0415 (the world's folder is known only at run time)

    return run_all


def _pick(scs: list[Scenario], only: str) -> list[Scenario]:
    pats = [p for p in only.split(",") if p] or [""]
    return [s for s in scs if any(p in s[0] for p in pats)]


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Headline numbers over scored rows (errors count as misses)."""
    healthy = [r for r in rows if r.get("healthy") or "healthy" in r["name"]]
    faulty = [r for r in rows if not (r.get("healthy") or "healthy" in r["name"])]
    lats = [
        r["latency_s"]
        for r in faulty
        if r.get("latency_s") is not None and r["latency_s"] >= -0.05
    ]
    pre = [r["name"] for r in faulty if r.get("pre_onset_incidents")]
    return {
        "fault_runs": len(faulty),
        "culprit_ok": sum(bool(r.get("culprit_ok")) for r in faulty),
        "component_ok": sum(bool(r.get("component_ok")) for r in faulty),
        "healthy_runs": len(healthy),
        "false_root_causes_healthy": sum(r.get("false_root_causes", 0) for r in healthy)
        + sum("error" in r for r in healthy),
        "healthy_runs_with_false": sum(
            bool(r.get("false_root_causes")) for r in healthy
        ),
        "pre_onset_incidents": sum(r.get("pre_onset_incidents", 0) for r in faulty),
        "fault_runs_with_pre_onset": pre,
        "detected_after_onset": len(lats),
        "detection_p50_s": _percentile(lats, 0.5),
        "detection_p90_s": _percentile(lats, 0.9),
        "errors": [r["name"] for r in rows if "error" in r],
    }


def _line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['name']}: ERROR {r['error'][:160]}"
    if r.get("healthy"):
        return f"{r['name']}: healthy, {r['false_root_causes']} false {r.get('named')}"
    mark = "ok" if r.get("culprit_ok") and r.get("component_ok") else "MISS"
    return (
        f"{r['name']}: r{r['truth_rank']} {r['truth_component']} -> r{r.get('rank')} "
        f"{r.get('component')}/{r.get('kind')} {mark} lat {r.get('latency_s')} "
        f"pre-onset {r.get('pre_onset_incidents', 0)}"
    )


def run(
    scs: list[Scenario], args: argparse.Namespace, run_all: Any
) -> list[dict[str, Any]]:
    """Generate, analyze and score every scenario; rows in scenario order."""
    work = Path(args.work)
    for sub in ("traces", "truth", "out"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = [
            ex.submit(run_all.run_one, s, args.mycroft, work, args.keep, args.reuse)
            for s in scs
        ]
        for f in cf.as_completed(futs):
            rows.append(f.result())
            print(" ", _line(rows[-1]), flush=True)
    order = {s[0]: i for i, s in enumerate(scs)}
    return sorted(rows, key=lambda r: order.get(r["name"], len(order)))


def _commit() -> str:
    p = subprocess.run(
        ["git", "rev-parse", "--short=10", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return p.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--half", choices=("tune", "report"), required=True)
    ap.add_argument("--only", default="", help="comma list of substrings of run names")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=1, help="tune seeds per fault")
    ap.add_argument("--seed-base", type=int, default=5000)
    ap.add_argument("--world", default=str(WORLD))
    ap.add_argument("--mycroft", default=str(ROOT / ".venv" / "bin" / "mycroft"))
    ap.add_argument("--work", default="/tmp/mycroft_campaign_indep")
    ap.add_argument("--keep", action="store_true", help="keep the traces")
    ap.add_argument("--reuse", action="store_true", help="analyze traces kept in WORK")
    ap.add_argument("--out", default="", help="results JSON (default by half)")
    args = ap.parse_args(argv)
    run_all = _world_modules(Path(args.world))
    if args.half == "tune":
        scs = tune_scenarios(args.seeds, args.seed_base)
    else:
        scs = run_all.scenarios(Path(args.world) / "scenarios.tsv")
    scs = _pick(scs, args.only)
    t0 = time.time()
    rows = run(scs, args, run_all)
    summary = summarize(rows)
    out = Path(args.out or RESULTS / f"campaign_indep_{args.half}.json")
    doc = {
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "command": "python bench/campaign_indep.py " + " ".join(argv or sys.argv[1:]),
        "half": args.half,
        "wall_s": round(time.time() - t0),
        "summary": summary,
        "rows": rows,
    }
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
