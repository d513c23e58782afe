"""What one worker snapshot of a job's engine costs: 64 and 1,024 ranks.

A worker writes each changed job's engine to the ``engine-snapshots``
changelog (``faust_runtime.dump_slot``: versioned parts + zlib) and commits its
offsets only after that, and a worker that takes a partition over restores
them (``load_slot``). Each size simulates a healthy job, and the same job
with a NIC capped at 30 % of its rate from ``ONSET_S`` on (a slowdown
incident is open, so its collectives since the onset go with the
snapshot), up to ``ONSET_S + WINDOW_S``, fed to one analyzer in process;
then dumps and restores its slot ``--repeat`` times. Reported: CPU seconds
of one dump and one restore (median; the least too), and the snapshot's
size. Snapshots may take ``app.SNAPSHOT_BUDGET`` of a worker's time, so the
dump cost sets how often a big job is snapshotted (``snapshot_every_s``, at
least ``snapshot_interval_s``), hence how much a restarted worker replays.
Writes ``bench/results/snapshot_cost.json``::

    python bench/snapshot_cost.py [--sizes 64,1024] [--repeat 5]
"""

from __future__ import annotations

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
from mycroft.streams.app import SNAPSHOT_BUDGET  # noqa: E402
from mycroft.streams.faust_runtime import JobSlot, dump_slot, load_slot  # noqa: E402
from mycroft.streams.faust_settings import StreamSettings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "snapshot_cost.json"
ONSET_S, WINDOW_S = 4.0, 4.0
INTERVAL_S = StreamSettings.__dataclass_fields__["snapshot_interval_s"].default
FAULT = f"nic-bandwidth:rank=9,at={ONSET_S},severity=0.7"


def _cpu(fn: Any, repeat: int) -> tuple[list[float], Any]:
    """CPU seconds of each of ``repeat`` calls of ``fn``, and its last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return times, out


def measure(size: int, faulty: bool, repeat: int) -> dict[str, Any]:
    """Simulate a job of ``size`` ranks; time dumping and restoring its slot."""
    tp, pp, dp = SHAPES[size]
    cfg = SimConfig(tp=tp, pp=pp, dp=dp, duration_s=ONSET_S + WINDOW_S, seed=1)
    replay = Replay()
    simulate(cfg, [parse_spec(FAULT)] if faulty else [], replay)
    engine = replay.analyzers[cfg.job_id]
    end_ns = cfg.start_ns + int((ONSET_S + WINDOW_S) * 1e9)
    slot = JobSlot(cfg.job_id, 0, engine, trace_ns=end_ns)
    dump_slot(slot)  # warm: the schemas are parsed on first use
    dumps, blob = _cpu(lambda: dump_slot(slot), repeat)
    loads, back = _cpu(lambda: load_slot(blob, 0, 0.0)[0], repeat)
    return {
        "ranks": size,
        "job": "slowdown incident" if faulty else "healthy",
        "incident_open": engine.incident is not None,
        "collectives_kept": len(back.engine.stats),
        "snapshot_mb": round(len(blob) / 1e6, 2),
        "dump_s": round(statistics.median(dumps), 3),
        "dump_min_s": round(min(dumps), 3),
        "restore_s": round(statistics.median(loads), 3),
        "restore_min_s": round(min(loads), 3),
        "snapshot_every_s": round(
            max(INTERVAL_S, statistics.median(dumps) / SNAPSHOT_BUDGET), 1
        ),
    }


def main() -> int:
    p = cost_args(__doc__, RESULTS, repeat=5)
    a = p.parse_args()
    rows = [
        measure(int(size), faulty, a.repeat)
        for size in a.sizes.split(",")
        for faulty in (False, True)
    ]
    write_rows(
        a.out, rows, trace_s=ONSET_S + WINDOW_S, repeat=a.repeat, budget=SNAPSHOT_BUDGET
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
