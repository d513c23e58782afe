"""Two-stage vs single-stage root cause on the same simulated traces.

Each fault is simulated once (64 ranks, tp 8 x pp 2 x dp 4 by default) and
the trace is analyzed twice in one process: by the single-stage ``Analyzer``
(``mycroft.streams.analyze.run``) and by split + ``--groups`` stage-1 groups +
the job resolver (``TwoStageReplay``). Reported per fault: the injected
(rank, component) and the top culprit of the first incident's latest revision
of each pipeline; the rank is right when it is the truth's or one equally
attached to the faulty part, as in the fault campaign.

    python bench/two_stage_accuracy.py [--groups 4] [--seed 2] \\
        [--out bench/results/two_stage_accuracy.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import RootCause
from mycroft.streams.analyze import run as single_stage
from mycroft.streams.core.two_stage import TwoStageReplay

FAULTS = (
    "gpu-hang:rank=21,at=6",
    "host-stall:rank=13,at=6",
    "nic-down:rank=42,at=6",
    "process-crash:rank=50,at=6",
    "collective-mismatch:rank=9,at=6",
    "nic-bandwidth:rank=9,at=5,severity=0.8",
    "pcie-downgrade:rank=12,at=5,severity=0.7",
    "gpu-power-cap:rank=30,at=5,severity=0.5",
    "proxy-delay:rank=17,at=5",
)


def top(causes: dict[str, RootCause]) -> list[Any] | None:
    """(rank, component) of the first incident's best culprit, or None."""
    if not causes:
        return None
    rc = min(causes.values(), key=lambda r: r.detected_ns)
    best = rc.culprits[0]
    return [best.rank, best.component.value]


def compare(fault: str, groups: int, seed: int, seconds: float) -> dict[str, Any]:
    """Simulate ``fault`` once; analyze with both pipelines."""
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=seconds, seed=seed, job_id="sim")
    writer = ListWriter()
    result = simulate(cfg, [parse_spec(fault)], writer)
    truth = result.truth()["faults"][0]
    _, single = single_stage(writer.records)
    two = TwoStageReplay("sim", groups)
    for ts, rec in writer.records:
        two.feed(ts, rec)
    two.close()
    want = [truth["rank"], truth["component"]]
    # The campaign's rule (bench/campaign/score.py): any rank equally attached
    # to the faulty part (the two GPUs of a NIC) is the right rank.
    attached = truth.get("ranks") or [truth["rank"]]
    got1, got2 = top(single), top(two.causes)
    return {
        "fault": fault,
        "truth": want,
        "single_stage": got1,
        "two_stage": got2,
        "rank_match": [bool(g and g[0] in attached) for g in (got1, got2)],
        "component_match": [bool(g and g[1] == want[1]) for g in (got1, got2)],
        "incidents": [len(single), len(two.causes)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=16.0)
    ap.add_argument(
        "--out", type=Path, default=Path("bench/results/two_stage_accuracy.json")
    )
    args = ap.parse_args()
    rows = []
    for fault in FAULTS:
        rows.append(compare(fault, args.groups, args.seed, args.seconds))
        print(json.dumps(rows[-1]), flush=True)
    doc = {
        "ranks": 64,
        "shape": "tp8 pp2 dp4",
        "groups": args.groups,
        "seed": args.seed,
        "trace_s": args.seconds,
        "note": "[single, two-stage] in the *_match and incidents lists",
        "faults": rows,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
