"""Simulator speed: (a) 1,024 ranks x 60 s virtual to a trace file, one core;
(b) the 16,384-rank load generator, records/s (encoded) and peak RSS.

Each part runs in its own process so its peak RSS is its own. Writes
``bench/results/sim_speed.json``. Usage::

    python bench/sim_speed.py [--duration 60] [--load-ticks 50] [--before FILE]

``--before FILE`` keeps, beside the new numbers, part (a) as measured on
earlier code: the JSON line ``python bench/sim_speed.py --part sim`` printed
there, with ``"commit"`` added to say which.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.loadgen import LoadConfig, LoadGen
from mycroft.producers.tracefile import TraceFileWriter
from mycroft.schemas.codec import Codec

RESULTS = Path(__file__).parent / "results" / "sim_speed.json"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def part_sim(duration_s: float) -> dict[str, object]:
    cfg = SimConfig(tp=8, pp=4, dp=32, duration_s=duration_s)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.trace"
        t0, c0 = time.perf_counter(), time.process_time()
        with TraceFileWriter(path) as writer:
            result = simulate(cfg, [], writer)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        size = path.stat().st_size
    return {
        "ranks": cfg.ranks,
        "tp": cfg.tp,
        "pp": cfg.pp,
        "dp": cfg.dp,
        "virtual_s": duration_s,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "goal_wall_s": 60.0,
        "meets_goal": wall <= 60.0,
        "iterations": result.iterations,
        "records": result.records,
        "trace_bytes": size,
        "peak_rss_mb": round(_rss_mb(), 1),
    }


def part_load(ticks: int) -> dict[str, object]:
    t0 = time.perf_counter()
    gen = LoadGen(LoadConfig(ranks=16_384))
    setup = time.perf_counter() - t0
    codec = Codec()
    nbytes = 0

    def sink(record: object) -> None:
        nonlocal nbytes
        nbytes += len(codec.encode(record))  # type: ignore[arg-type]

    t0 = time.perf_counter()
    n = gen.run(ticks, sink)
    wall = time.perf_counter() - t0
    return {
        "ranks": gen.replicas * gen.tpl_ranks,
        "hosts": gen.hosts,
        "ticks": ticks,
        "records": n,
        "setup_s": round(setup, 2),
        "wall_s": round(wall, 2),
        "records_per_s": round(n / wall),
        "mb_per_s": round(nbytes / wall / 1e6, 1),
        "virtual_x_realtime": round(ticks * 0.1 / wall, 2),
        "peak_rss_mb": round(_rss_mb(), 1),
        "goal_rss_mb": 2048,
    }


def _commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(
            ["git", *a],
            capture_output=True,
            text=True,
            check=False,
            cwd=RESULTS.parents[2],
        ).stdout.strip()

    changed = git("status", "--porcelain", "--", "producers/sim")
    return git("rev-parse", "--short=10", "HEAD") + ("+changes" if changed else "")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--load-ticks", type=int, default=50)
    p.add_argument("--part", choices=["sim", "load"])
    p.add_argument("--before", type=Path, help="part (a) measured on earlier code")
    args = p.parse_args()
    if args.part == "sim":
        print(json.dumps(part_sim(args.duration)))
        return 0
    if args.part == "load":
        print(json.dumps(part_load(args.load_ticks)))
        return 0
    env = os.environ | {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out: dict[str, object] = {
        "commit": _commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }
    if args.before:
        out["sim_before"] = json.loads(args.before.read_text())
    for part in ("sim", "load"):
        cmd = [
            "taskset",
            "-c",
            "0",
            sys.executable,
            __file__,
            "--part",
            part,
            "--duration",
            str(args.duration),
            "--load-ticks",
            str(args.load_ticks),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        out[part] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(part, out[part], flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
