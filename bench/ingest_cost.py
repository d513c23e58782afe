"""What one analyzer costs per second of a healthy job: 64 and 1,024 ranks.

Each size simulates ``--seconds`` of a healthy job into memory, then feeds
the records to one ``Analyzer`` as a worker does (every record ingested,
``evaluate`` every 100 ms of trace time), ``--repeat`` times, and keeps the
least CPU time. Reported: rank-state rows and completed collectives per
trace second, CPU seconds per trace second split into state ingest,
completion ingest (queueing the batch) and evaluate (which joins the queued
completions into collectives and observes them as one block), and rank-state
rows per CPU second. A CPU-per-trace-second
above 1 means one core cannot follow the job in real time (the two stages of
streams/SCALING.md split it). Writes ``bench/results/ingest_cost.json``::

    python bench/ingest_cost.py [--sizes 64,1024] [--seconds 6] [--repeat 3]
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign_offline import SHAPES, cost_args, write_rows  # noqa: E402
from mycroft.producers.sim.config import SimConfig  # noqa: E402
from mycroft.producers.sim.engine import simulate  # noqa: E402
from mycroft.producers.tracefile import ListWriter  # noqa: E402
from mycroft.schemas.records import CompletionBatch, StateBatch  # noqa: E402
from mycroft.streams.core.engine import Analyzer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "ingest_cost.json"
CADENCE_NS = 100_000_000


def feed(records: list[tuple[int, Any]], job_id: str) -> dict[str, float]:
    """Feed ``records`` to a fresh analyzer; return CPU seconds per phase."""
    cpu: Counter[str] = Counter()
    an, clock = Analyzer(job_id), time.process_time
    next_eval = records[0][0]
    for ts, rec in records:
        while next_eval <= ts:
            t0 = clock()
            an.evaluate(next_eval)
            cpu["evaluate"] += clock() - t0
            next_eval += CADENCE_NS
        t0 = clock()
        an.ingest(rec, ts)
        phase = {StateBatch: "state", CompletionBatch: "completion"}.get(type(rec))
        cpu[phase or "other"] += clock() - t0
    return dict(cpu)


def measure(size: int, seconds: float, repeat: int) -> dict[str, Any]:
    """Simulate ``seconds`` of a healthy ``size``-rank job and time its feed."""
    tp, pp, dp = SHAPES[size]
    cfg = SimConfig(tp=tp, pp=pp, dp=dp, duration_s=seconds, seed=1)
    out = ListWriter()
    simulate(cfg, [], out)
    records = [(ts, rec) for ts, rec in out.records]
    rc = sum(len(r.rc) for _, r in records if isinstance(r, StateBatch))
    done = sum(len(r.op) for _, r in records if isinstance(r, CompletionBatch))
    best = min((feed(records, cfg.job_id) for _ in range(repeat)), key=_total)
    total = _total(best)
    return {
        "ranks": size,
        "trace_s": seconds,
        "rc_rows_per_trace_s": round(rc / seconds),
        "completion_rows_per_trace_s": round(done / seconds),
        "cpu_s_per_trace_s": round(total / seconds, 3),
        "cpu_s_per_trace_s_by_phase": {
            k: round(v / seconds, 3) for k, v in sorted(best.items())
        },
        "rc_rows_per_cpu_s": round(rc / total),
    }


def _total(cpu: dict[str, float]) -> float:
    return sum(cpu.values())


def main() -> int:
    p = cost_args(__doc__, RESULTS, repeat=3)
    p.add_argument("--seconds", type=float, default=6.0)
    a = p.parse_args()
    rows = []
    for size in a.sizes.split(","):
        rows.append(measure(int(size), a.seconds, a.repeat))
        print(json.dumps(rows[-1]), flush=True)
    write_rows(a.out, rows, cadence_ms=CADENCE_NS // 1_000_000, repeat=a.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
