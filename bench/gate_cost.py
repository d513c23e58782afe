"""What the input contract costs per trace second: no gate, per-row checks
only, and the whole-batch fast path (``streams/core/row_fastpath.py``).

Each size simulates ``--seconds`` of a healthy job into memory and feeds
every record to a fresh ``Analyzer.ingest`` in three modes, interleaved
``--repeat`` times in one run (so the ratios share the machine's load), and
keeps each mode's least CPU time:

* ``none``: the gate admits everything unchecked (the cost floor);
* ``per-row``: every batch through ``row_checks`` (the fast path off);
* ``fast``: the shipped gate (whole-batch checks, per-row ones on failure).

Writes ``bench/results/gate_cost.json``::

    python bench/gate_cost.py [--sizes 64,1024] [--seconds 3] [--repeat 3]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign_offline import SHAPES, cost_args, write_rows  # noqa: E402
from mycroft.producers.sim.config import SimConfig  # noqa: E402
from mycroft.producers.sim.engine import simulate  # noqa: E402
from mycroft.producers.tracefile import ListWriter  # noqa: E402
from mycroft.schemas.records import Record  # noqa: E402
from mycroft.streams.core.engine import Analyzer  # noqa: E402
from mycroft.streams.core.record_gate import RecordGate  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gate_cost.json"
MODES = ("none", "per-row", "fast")


def _patches() -> dict[str, dict[str, Callable[..., Any]]]:
    admit, clean = RecordGate.admit, RecordGate._clean

    def unchecked(self: RecordGate, record: Record, now_ns: int) -> list[Record]:
        self.released = 0
        return [record]

    return {
        "none": {"admit": unchecked, "_clean": clean},
        "per-row": {"admit": admit, "_clean": lambda self, b: False},
        "fast": {"admit": admit, "_clean": clean},
    }


def feed(records: list[tuple[int, Record]], job_id: str) -> float:
    """CPU seconds of ``Analyzer.ingest`` over ``records``."""
    an, cpu, clock = Analyzer(job_id), 0.0, time.process_time
    for ts, rec in records:
        t0 = clock()
        an.ingest(rec, ts)
        cpu += clock() - t0
    return cpu


def measure(size: int, seconds: float, repeat: int) -> dict[str, Any]:
    """Simulate a healthy ``size``-rank job; the least ingest CPU per mode."""
    tp, pp, dp = SHAPES[size]
    cfg = SimConfig(tp=tp, pp=pp, dp=dp, duration_s=seconds, seed=1)
    out = ListWriter()
    simulate(cfg, [], out)
    records = list(out.records)
    patches, best = _patches(), {m: float("inf") for m in MODES}
    try:
        for _ in range(repeat):
            for mode in MODES:
                for name, fn in patches[mode].items():
                    setattr(RecordGate, name, fn)
                best[mode] = min(best[mode], feed(records, cfg.job_id))
    finally:
        for name, fn in patches["fast"].items():
            setattr(RecordGate, name, fn)
    gate = {m: best[m] - best["none"] for m in MODES}
    return {
        "ranks": size,
        "trace_s": seconds,
        "records": len(records),
        "ingest_cpu_s_per_trace_s": {m: round(best[m] / seconds, 3) for m in MODES},
        "gate_cpu_us_per_record": {
            m: round(gate[m] / len(records) * 1e6, 1) for m in MODES[1:]
        },
        "gate_cost_fast_over_per_row": round(gate["fast"] / gate["per-row"], 2),
    }


def main() -> int:
    p = cost_args(__doc__, RESULTS, repeat=3)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args()
    rows = []
    for size in a.sizes.split(","):
        rows.append(measure(int(size), a.seconds, a.repeat))
        print(rows[-1], flush=True)
    write_rows(a.out, rows, repeat=a.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
