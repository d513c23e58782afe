"""Where ``mycroft analyze`` spends its CPU on a healthy job, by stage.

For each size (1,024 ranks: tp 8, pp 4, dp 32; 2,048 ranks: tp 8, pp 8,
dp 32; 20 s, seed 5) the script simulates a trace once, times
``mycroft analyze TRACE --json`` under ``/usr/bin/time`` (user + sys CPU
seconds and peak RSS, no profiler attached), then runs the same code path
under pyinstrument in a child process and writes the samples, grouped by
stage, to ``bench/profiles/analyze_<ranks>.txt``. The timings go to
``bench/results/analyze_cost.json``. Usage::

    python bench/profile_analyze.py [--sizes 1024,2048] [--duration 20] \\
        [--traces DIR]

A sample counts toward the innermost frame of the stack that belongs to a
known stage (``STAGES``), so a numpy call is charged to the module that made
it. pyinstrument samples wall time; the shares are scaled to the profiled
run's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PROFILES = BENCH / "profiles"
RESULTS = BENCH / "results" / "analyze_cost.json"
SHAPES = {1024: (8, 4, 32), 2048: (8, 8, 32)}
SEED = 5

_CORE = "streams/core/"
# stage -> path suffixes of its modules (relative to the repository root)
STAGES: dict[str, tuple[str, ...]] = {
    "trace decode": ("producers/tracefile.py", "schemas/"),
    "record gate": tuple(
        _CORE + m
        for m in (
            "record_gate.py",
            "row_checks.py",
            "row_fastpath.py",
            "contract.py",
            "topology_contract.py",
            "host_clocks.py",
        )
    ),
    "event clock": (_CORE + "event_time.py", "streams/analyze.py"),
    "progress store": tuple(
        _CORE + m for m in ("progress.py", "rows.py", "membership.py", "ports.py")
    ),
    "completion join": tuple(
        _CORE + m for m in ("completions.py", "collective_stat.py")
    ),
    "baselines": (_CORE + "baseline.py", _CORE + "baseline_columns.py"),
    "detectors": tuple(
        _CORE + m
        for m in (
            "detect.py",
            "detect_ports.py",
            "detect_slow.py",
            "detect_wire.py",
            "hang_in_op.py",
            "hold_back.py",
            "compute_gaps.py",
            "transfer_times.py",
            "flow_features.py",
            "link_backlog.py",
            "backlog_receiver.py",
        )
    ),
    "root cause": tuple(
        _CORE + m
        for m in (
            "rca_hang.py",
            "rca_hosts.py",
            "rca_mismatch.py",
            "rca_ports.py",
            "rca_slow.py",
            "rca_timing.py",
            "rca_transfers.py",
            "graph.py",
            "scoring.py",
            "suspect.py",
            "culprit_scope.py",
            "link_blame.py",
            "link_rules.py",
            "evidence.py",
            "incidents.py",
            "topology.py",
        )
    ),
    "engine (dedup, dispatch)": (_CORE + "engine.py", _CORE + "config.py"),
    "command line and output": ("mycroft/", "verdict.py"),
}


def stage_of(path: str) -> str | None:
    """The stage a source file belongs to, or None."""
    p = path.replace("\\", "/")
    rel = p[len(str(ROOT)) + 1 :] if p.startswith(str(ROOT) + "/") else ""
    for stage, suffixes in STAGES.items():
        if rel and any(
            rel == s or (s.endswith("/") and rel.startswith(s)) for s in suffixes
        ):
            return stage
    return None


def _commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short=10", "HEAD"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "streams", "producers", "schemas"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    ).stdout.strip()
    return out + ("+changes" if dirty else "")


def simulate(size: int, duration: float, out: Path) -> None:
    """Write a healthy ``size``-rank trace to ``out`` (kept if it exists)."""
    if out.exists():
        return
    tp, pp, dp = SHAPES[size]
    cmd = [sys.executable, "-m", "mycroft", "simulate", "--ranks", str(size)]
    cmd += ["--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--seed", str(SEED)]
    cmd += ["--duration", f"{duration:g}", "--out", str(out)]
    cmd += ["--truth", str(out.with_suffix(".truth.json"))]
    subprocess.run(cmd, check=True, cwd=ROOT)


def timed(trace: Path) -> dict[str, float]:
    """``/usr/bin/time`` of ``mycroft analyze TRACE --json``: CPU s, RSS."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        cmd = ["/usr/bin/time", "-f", "%U %S %e %M", "-o", tf.name]
        cmd += [sys.executable, "-m", "mycroft", "analyze", str(trace), "--json"]
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, check=False)
        if proc.returncode not in (0, 3):
            raise SystemExit(f"analyze exited {proc.returncode}")
        user, sys_, wall, rss_kb = tf.read().split()[-4:]
    return {
        "user_s": float(user),
        "sys_s": float(sys_),
        "wall_s": float(wall),
        "peak_rss_mb": round(int(rss_kb) / 1024, 1),
    }


def _leaves(frame: Any, stack: tuple[str, ...], out: dict[str, Any]) -> None:
    path = frame.file_path or ""
    here = (*stack, path) if not frame.is_synthetic else stack
    children = [c for c in frame.children]
    own = frame.time - sum(c.time for c in children)
    if own > 0 or not children:
        t = own if children else frame.time
        stage = next((s for p in reversed(here) if (s := stage_of(p))), None)
        name = "other (interpreter, imports, libraries)" if stage is None else stage
        out["stage"][name] += t
        # the innermost frame of that stage, for the per-stage top list
        for p, fn in reversed(list(zip(here, out["_fns"], strict=False))):
            if stage_of(p) == stage:
                out["fn"][(name, fn)] += t
                break
    short = (frame.file_path_short or "").removeprefix("../")
    out["_fns"].append(f"{frame.function} ({short}:{frame.line_no})")
    for c in children:
        _leaves(c, here, out)
    out["_fns"].pop()


def profile(trace: Path, out: Path, label: str) -> dict[str, float]:
    """Profile the analyze code path on ``trace``; return CPU s by stage."""
    # imported here: the parent process only runs commands
    from pyinstrument import Profiler  # noqa: PLC0415

    from mycroft.producers.tracefile import read_records  # noqa: PLC0415
    from mycroft.streams.analyze import run, to_json  # noqa: PLC0415

    prof = Profiler(interval=0.002, async_mode="disabled")
    c0, w0 = time.process_time(), time.perf_counter()
    prof.start()
    anomalies, causes = run(read_records(trace))
    to_json(anomalies, causes)
    prof.stop()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    root = prof.last_session.root_frame() if prof.last_session else None
    acc: dict[str, Any] = {
        "stage": defaultdict(float),
        "fn": defaultdict(float),
        "_fns": [],
    }
    if root is not None:
        _leaves(root, (), acc)
    total = sum(acc["stage"].values()) or 1.0
    lines = [
        f"# mycroft analyze, {label}",
        "",
        f"Profiled with pyinstrument (2 ms samples) at {_commit()}; {cpu:.1f} CPU s, "
        f"{wall:.1f} s wall under the profiler. CPU s below = share of samples "
        "x CPU s. Regenerate: python bench/profile_analyze.py",
        "",
        f"{'stage':<42}{'CPU s':>8}{'share':>8}",
    ]
    for stage, t in sorted(acc["stage"].items(), key=lambda kv: -kv[1]):
        lines.append(f"{stage:<42}{t / total * cpu:>8.2f}{t / total:>8.1%}")
    lines += ["", "Top functions of each stage (self time, CPU s):", ""]
    for stage, _ in sorted(acc["stage"].items(), key=lambda kv: -kv[1]):
        fns = sorted(
            ((fn, t) for (s, fn), t in acc["fn"].items() if s == stage),
            key=lambda kv: -kv[1],
        )[:6]
        if not fns:
            continue
        lines.append(f"{stage}:")
        lines += [f"  {t / total * cpu:7.2f}  {fn}" for fn, t in fns]
    out.write_text("\n".join(lines) + "\n")
    return {s: round(t / total * cpu, 2) for s, t in acc["stage"].items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1024,2048")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--traces", type=Path, help="keep the traces here (reused)")
    p.add_argument("--profile", nargs=3, metavar=("TRACE", "OUT", "LABEL"))
    args = p.parse_args()
    if args.profile:
        trace, out, label = args.profile
        print(json.dumps(profile(Path(trace), Path(out), label)))
        return 0
    PROFILES.mkdir(exist_ok=True)
    sizes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        where = args.traces or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for size in (int(s) for s in args.sizes.split(",")):
            tp, pp, dp = SHAPES[size]
            trace = where / f"healthy_{size}_{args.duration:g}s.trace"
            simulate(size, args.duration, trace)
            t = timed(trace)
            cpu = t["user_s"] + t["sys_s"]
            sizes[str(size)] = {
                "tp": tp,
                "pp": pp,
                "dp": dp,
                "trace_s": args.duration,
                **t,
                "cpu_s_per_trace_s": round(cpu / args.duration, 2),
                "ranks_per_core": round(size / (cpu / args.duration)),
            }
            print(size, sizes[str(size)], flush=True)
            label = f"healthy {size} ranks (tp {tp}, pp {pp}, dp {dp})"
            label += f", {args.duration:g} s"
            out = PROFILES / f"analyze_{size}.txt"
            cmd = [sys.executable, __file__, "--profile", str(trace), str(out), label]
            proc = subprocess.run(
                cmd, check=True, cwd=ROOT, stdout=subprocess.PIPE, text=True
            )
            stages = json.loads(proc.stdout.strip().splitlines()[-1])
            sizes[str(size)]["profile"] = f"bench/profiles/analyze_{size}.txt"
            sizes[str(size)]["profiled_cpu_s_by_stage"] = stages
    RESULTS.write_text(
        json.dumps(
            {
                "commit": _commit(),
                "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                "command": "python bench/profile_analyze.py",
                "seed": SEED,
                "sizes": sizes,
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
