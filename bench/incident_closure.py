"""When incidents close: faults that clear, faults that last, healthy runs.

Each scenario simulates a 32-rank job (tp 8, pp 2, dp 2) into memory and
runs ``mycroft analyze``'s replay over it; the injector's ground truth is
read here, to score, never by the analyzer. Per scenario it reports the
incidents with a root cause, how many closed before the trace ended, and for
a fault that cleared, how long after its end (event time) the closing
revision came; for a fault that lasts to the end, a closed incident is a
premature closure::

    python bench/incident_closure.py [--seconds 20] [--seeds 1,2]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mycroft.producers.sim.config import SimConfig  # noqa: E402
from mycroft.producers.sim.engine import simulate  # noqa: E402
from mycroft.producers.sim.faults import parse_spec  # noqa: E402
from mycroft.producers.tracefile import ListWriter  # noqa: E402
from mycroft.streams.analyze import Replay  # noqa: E402

S = 1_000_000_000
CLEARS = ("nic-bandwidth", "gpu-power-cap", "proxy-delay", "pcie-downgrade",
          "nic-down", "host-stall")  # fmt: skip
"""Faults injected at 4 s for 4 s (they clear at 8 s; the simulator's
gpu-hang and process-crash never clear, whatever their duration)."""
LASTS = ("nic-bandwidth", "nic-down", "gpu-hang")
"""Faults injected at 4 s that last to the end of the trace."""


@dataclass(frozen=True)
class Row:
    """One scenario's incidents and when they closed."""

    fault: str
    seed: int
    incidents: int
    closed: int
    delays_s: tuple[float, ...]  # closed_ns - fault end, per closed incident

    def text(self) -> str:
        delays = ", ".join(f"{d:.1f}" for d in self.delays_s) or "-"
        return (
            f"{self.fault:<42} seed {self.seed}  incidents {self.incidents}  "
            f"closed {self.closed}  after the fault's end (s): {delays}"
        )


def scenario(fault: str, seed: int, seconds: float) -> Row:
    """Simulate, analyze, and score one fault spec (empty: healthy)."""
    cfg = SimConfig(tp=8, pp=2, dp=2, duration_s=seconds, seed=seed)
    out = ListWriter()
    truth = simulate(cfg, [parse_spec(fault)] if fault else [], out)
    replay = Replay()
    for ts, rec in out.records:
        replay.feed(ts, rec)
    _, causes = replay.finish()
    ends = [f.end_s for f in truth.faults if f.end_s < seconds]
    end_ns = cfg.start_ns + int(min(ends) * S) if ends else None
    closed = [rc.closed_ns for rc in causes.values() if rc.closed_ns is not None]
    delays = tuple((c - end_ns) / S for c in closed) if end_ns is not None else ()
    return Row(fault or "healthy", seed, len(causes), len(closed), delays)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--json", action="store_true", help="one JSON row per line")
    args = ap.parse_args(argv)
    specs = ["", *(f"{f}:at=4,duration=4" for f in CLEARS),
             *(f"{f}:at=4" for f in LASTS)]  # fmt: skip
    for seed in (int(s) for s in args.seeds.split(",")):
        for spec in specs:
            row = scenario(spec, seed, args.seconds)
            print(json.dumps(row.__dict__) if args.json else row.text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
