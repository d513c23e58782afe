"""Regenerate benchmark results: ``./dev bench [NAME...]``.

Runs each named benchmark script (all by default) with its checked-in output
path, then rewrites ``bench/RESULTS.md`` from every ``bench/results/*.json``.
``./dev bench --check`` reruns nothing: it lists the sections measured before
the last change to the code they measure, and exits 1 when there are any.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# name -> script arguments; each script writes bench/results/<name>.json
BENCHMARKS: dict[str, list[str]] = {
    "broker_startup": ["--out", "bench/results/broker_startup.json"],
    "message_size": ["--out", "bench/results/message_size.json"],
    "sim_speed": [],
    "rca_cost": [],
    "ingest_cost": [],
    "gate_cost": [],
    "snapshot_cost": [],
    "agent_footprint": ["--out", "bench/results/agent_footprint.json"],
    "streams_throughput": ["--out", "bench/results/streams_throughput.json"],
    "profile_analyze": [],  # writes analyze_cost.json and bench/profiles/
}


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        report = [sys.executable, str(BENCH / "report.py"), "--check"]
        return subprocess.run(report, cwd=BENCH.parent, check=False).returncode
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}")
        return 2
    for name in names:
        print(f"== {name}", flush=True)
        script = BENCH / f"{name}.py"
        subprocess.run(
            [sys.executable, str(script), *BENCHMARKS[name]],
            check=True,
            cwd=BENCH.parent,
        )
    subprocess.run(
        [sys.executable, str(BENCH / "report.py")], check=True, cwd=BENCH.parent
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
