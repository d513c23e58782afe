"""Root-cause cost per refresh as the job grows: 64 and 1,024 ranks.

Each size simulates the same slowdown (a NIC capped to 30 % of its rate on
rank 9 at 6 s, and a GPU power cap on rank 30 at 6 s) up to 4 s after the
onset, fed to the analyzer in process, then times the slowdown root cause
over that window (the work of one refresh: reading the collectives kept
since the onset and ``explain_slowdown`` over them and every flow snapshot of
the window), median of ``--repeat``. An incident refreshes every 1 s of
trace while its answer changes or anomalies join it, and half as often each
time the answer holds (down to every 4 s), so a refresh that costs more than
1 s puts a real-time worker behind early in an incident. Only the cost is
measured here (the campaigns score the answers); each refresh is timed
again without the compute gaps (``every_comm=False``), alternately, to give
their share. A hang's root cause is timed the same way on a GPU that hangs
(rank 30 at 6 s) and a NIC that goes down (rank 9's at 6 s): one
``explain_hang`` over the latest state (the wait-for graph over every busy
rank and its flow rows, the terminal groups, the hang rules), refreshed
every 1 s of trace too. The slowdown rows also time one wire check
(``detect_slow_wire`` at the end of the window: every pair's wire time
against its own, and the parts they share), which runs once a second of
event time whether or not an incident is open. Writes
``bench/results/rca_cost.json``.
Usage::

    python bench/rca_cost.py [--sizes 64,1024] [--repeat 3]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign_offline import SHAPES, cost_args, write_rows  # noqa: E402
from mycroft.producers.sim.config import SimConfig  # noqa: E402
from mycroft.producers.sim.engine import simulate  # noqa: E402
from mycroft.producers.sim.faults import parse_spec  # noqa: E402
from mycroft.streams.analyze import Replay  # noqa: E402
from mycroft.streams.core.detect_wire import detect_slow_wire  # noqa: E402
from mycroft.streams.core.rca_hang import explain_hang  # noqa: E402
from mycroft.streams.core.rca_slow import explain_slowdown  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "rca_cost.json"
ONSET_S, WINDOW_S = 6.0, 4.0
FAULTS = {
    "nic-bandwidth": f"nic-bandwidth:rank=9,at={ONSET_S},severity=0.7",
    "gpu-power-cap": f"gpu-power-cap:rank=30,at={ONSET_S},severity=0.5",
}
HANGS = {
    "gpu-hang": f"gpu-hang:rank=30,at={ONSET_S}",
    "nic-down": f"nic-down:rank=9,at={ONSET_S}",
}


def _analyzer(size: int, spec: str) -> tuple[SimConfig, Any]:
    """Simulate ``spec`` at ``size`` ranks to onset + WINDOW_S; its analyzer."""
    tp, pp, dp = SHAPES[size]
    cfg = SimConfig(tp=tp, pp=pp, dp=dp, duration_s=ONSET_S + WINDOW_S, seed=1)
    replay = Replay()
    simulate(cfg, [parse_spec(spec)], replay)
    return cfg, replay.analyzers[cfg.job_id]


def measure(size: int, fault: str, repeat: int) -> dict[str, Any]:
    """Simulate ``fault`` at ``size`` ranks to onset + WINDOW_S; time one refresh."""
    cfg, analyzer = _analyzer(size, FAULTS[fault])
    since = cfg.start_ns + int(ONSET_S * 1e9)
    times, without = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        stats = analyzer.stats.since(since)
        explain_slowdown(analyzer.ctx, stats, since)
        times.append(time.perf_counter() - t0)
        # The same refresh without the compute gaps (as a stage-1 worker
        # runs it), alternated with the full one.
        t0 = time.perf_counter()
        stats = analyzer.stats.since(since)
        explain_slowdown(analyzer.ctx, stats, since, every_comm=False)
        without.append(time.perf_counter() - t0)
    return _wire_check(analyzer, since, repeat) | {
        "ranks": size,
        "fault": fault,
        "collectives": len(stats),
        "flow_snapshot_rows": len(analyzer.ctx.store.flow_history(since)),
        "refresh_s": round(statistics.median(times), 3),
        "refresh_max_s": round(max(times), 3),
        "refresh_without_gaps_s": round(statistics.median(without), 3),
    }


def _wire_check(analyzer: Any, since: int, repeat: int) -> dict[str, Any]:
    """The median cost of one wire check at the window's end."""
    now = since + int(WINDOW_S * 1e9)
    times = []
    for _ in range(repeat):
        analyzer.ctx.store.wire.last_check = -1  # due now
        t0 = time.perf_counter()
        detect_slow_wire(analyzer.ctx, now)
        times.append(time.perf_counter() - t0)
    return {
        "timed_transfers": len(analyzer.ctx.store.transfers.kept()),
        "wire_check_s": round(statistics.median(times), 3),
    }


def measure_hang(size: int, fault: str, repeat: int) -> dict[str, Any]:
    """Simulate the hang ``fault`` at ``size`` ranks; time one refresh."""
    cfg, analyzer = _analyzer(size, HANGS[fault])
    store = analyzer.ctx.store
    now = cfg.start_ns + int((ONSET_S + WINDOW_S) * 1e9)
    since = cfg.start_ns + int(ONSET_S * 1e9)
    busy = store.slots["issued"] > store.slots["done"]
    ranks = {int(r) for r in store.slots["rank"][busy].tolist()}
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        explain_hang(analyzer.ctx, ranks, now, since)
        times.append(time.perf_counter() - t0)
    return {
        "ranks": size,
        "fault": fault,
        "busy_rank_comms": int(busy.sum()),
        "latest_flow_rows": len(store.latest_flows()),
        "refresh_s": round(statistics.median(times), 3),
        "refresh_max_s": round(max(times), 3),
    }


def main() -> int:
    p = cost_args(__doc__, RESULTS, repeat=3)
    a = p.parse_args()
    rows = [
        measure(int(size), fault, a.repeat)
        for size in a.sizes.split(",")
        for fault in FAULTS
    ] + [
        measure_hang(int(size), fault, a.repeat)
        for size in a.sizes.split(",")
        for fault in HANGS
    ]
    for row in rows:
        print(json.dumps(row), flush=True)
    write_rows(a.out, rows, window_s=WINDOW_S, repeat=a.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
