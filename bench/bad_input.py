"""Valid-Avro-but-wrong records against the analyzer: crashes, false root
causes, culprit changes and the longest single engine call.

For each simulated 64-rank run (faults x seeds, plus healthy runs) the clean
records are analysed, then the same records with ``--per-category`` wrong
records of every category (``tests/unit/core/bad_records.py``: copies of the
run's own state batches, one value broken, round-tripped through the codec,
a fresh ``agent_seq`` of the same agent) mixed in at their own times, and
null values (tombstones) decoded. Counted: records tried and rejected per
category, crashes (any exception out of the codec or the engine), false root
causes (any on a healthy run), culprit changes (best rank, component and
kind differ from the clean run's), culprits outside the job's ranks.

The event loop of a worker runs ``Analyzer.ingest`` and ``evaluate`` (and
the decode) synchronously, so the longest single call is the longest the
job can block it: reported as p99 and max over every call of every run, and
for one hanging run with a real 250,000-row state batch mixed in (encoded,
decoded, ingested, evaluated after it). Writes ``bench/results/bad_input.json``::

    python bench/bad_input.py [--seeds 2] [--per-category 20] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign_offline import source_commit  # noqa: E402
from mycroft.errors import DecodeError  # noqa: E402
from mycroft.producers.sim.config import SimConfig  # noqa: E402
from mycroft.producers.sim.engine import simulate  # noqa: E402
from mycroft.producers.sim.faults import parse_spec  # noqa: E402
from mycroft.producers.tracefile import ListWriter  # noqa: E402
from mycroft.schemas.codec import Codec  # noqa: E402
from mycroft.schemas.records import RootCause, StateBatch  # noqa: E402
from mycroft.streams.core.contract import Contract  # noqa: E402
from mycroft.streams.core.engine import Analyzer  # noqa: E402
from tests.unit.core import bad_records as bad  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "bad_input.json"
CADENCE_NS = 100_000_000
MAX_GAP_NS = 60_000_000_000
WORLD = 64
FAULTS = ("gpu-hang", "nic-down", "process-crash", "gpu-power-cap", "nic-bandwidth")
I32, I64 = np.iinfo(np.int32), np.iinfo(np.int64)


def _either(rng: np.random.Generator, *ranges: tuple[int, int]) -> int:
    lo, hi = ranges[int(rng.integers(len(ranges)))]
    return int(rng.integers(lo, hi, endpoint=True))


OLD = Contract().min_time_ns
VALUES = {
    "rank-negative": lambda g: _either(g, (I32.min, -1)),
    "rank-beyond-world": lambda g: _either(g, (WORLD, I32.max)),
    "peer-outside-comm": lambda g: _either(g, (I32.min, -1), (WORLD, I32.max)),
    "tick-implausible": lambda g: _either(g, (I64.min, OLD - 1), (5 * 10**18, I64.max)),
    "tick-jump": lambda g: _either(g, (2 * 10**18, 4 * 10**18)),
    "counter-order": lambda g: _either(g, (I32.min, -1), (1 << 30, I32.max)),
    "layout": lambda g: _either(g, (-(10**6), -1), (1, 10**6)),
    "seq": lambda g: _either(g, (I64.min, -2)),
    "row-time": lambda g: _either(g, (I64.min, OLD - 1), (5 * 10**18, I64.max)),
    "empty-state": lambda g: 0,
    "unknown-comm": lambda g: _either(g, (1 << 40, I64.max)),
}
"""A value generator per category of ``bad_records.CATEGORIES``."""


def _run(records: list[tuple[int, Any]], job: str) -> dict[str, Any]:
    """Feed an analyzer as a worker does; time every call."""
    an, calls = Analyzer(job), []
    out: list[Any] = []
    nxt = records[0][0]
    crash = ""
    try:
        for ts, rec in records:
            if ts - nxt > MAX_GAP_NS:
                nxt += ((ts - nxt) // CADENCE_NS) * CADENCE_NS
            while nxt <= ts:
                t0 = time.perf_counter()
                out += an.evaluate(nxt)
                calls.append(time.perf_counter() - t0)
                nxt += CADENCE_NS
            t0 = time.perf_counter()
            an.ingest(rec, ts)
            calls.append(time.perf_counter() - t0)
        out += an.evaluate(nxt)
    except Exception as exc:  # noqa: BLE001 - a crash is what is counted
        crash = repr(exc)
    causes = [f for f in out if isinstance(f, RootCause)]
    best = causes[0].culprits[0] if causes and causes[0].culprits else None
    counts: Counter[str] = Counter()
    for (reason, _host), n in an.gate.counts.items():
        counts[reason] += n
    return {
        "crash": crash,
        "causes": causes,
        "best": (best.rank, best.component.value, best.kind.value) if best else None,
        "ranks": {c.rank for f in causes for c in f.culprits},
        "calls": calls,
        "counts": counts,
    }


def _wrong(records, rng, per_category: int, codec: Codec) -> tuple[list, Counter]:
    """Wrong records per category, as ``(ts, record)`` at their own times."""
    start = records[0][0] + 2_000_000_000
    full = [
        (t, r)
        for t, r in records
        if isinstance(r, StateBatch) and t > start and min(_sizes(r)) > 0
    ]
    out, tried, seq = [], Counter(), 10**7
    for name, (mutate, _, _) in sorted(bad.CATEGORIES.items()):
        for _ in range(per_category):
            t, b = full[int(rng.integers(len(full)))]
            seq += 1
            rec = codec.decode(codec.encode(mutate(b, seq, VALUES[name](rng))))
            out.append((t, rec))
            tried[name] += 1
    return out, tried


def _sizes(b: StateBatch) -> tuple[int, int, int]:
    return len(b.rc), len(b.op), len(b.flow)


def _merge(records, extra):
    both = [(t, 0, i, r) for i, (t, r) in enumerate(records)]
    both += [(t, 1, i, r) for i, (t, r) in enumerate(extra)]
    both.sort(key=lambda e: e[:3])
    return [(t, r) for t, _, _, r in both]


def _simulate(fault: str, seed: int, seconds: float) -> list[tuple[int, Any]]:
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=seconds, seed=seed)
    specs = [] if fault == "healthy" else [parse_spec(f"{fault}:at={seconds / 2}")]
    w = ListWriter()
    simulate(cfg, specs, w)
    return list(w.records)


def _huge(records, codec: Codec) -> dict[str, Any]:
    """A real 250,000-row state batch amid a hang: each step's time."""
    t, b = next(
        (t, r)
        for t, r in records
        if isinstance(r, StateBatch) and t > records[0][0] + 12 * 10**9 and len(r.rc)
    )
    big = StateBatch(bad._copy(b, 10**8).header, np.resize(b.rc, 250_000), b.op, b.flow)
    t0 = time.perf_counter()
    wire = codec.encode(big)
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = codec.decode(wire)
    decode_s = time.perf_counter() - t0
    run = _run(_merge(records, [(t, back)]), "sim")
    return {
        "rows": 250_000,
        "bytes": len(wire),
        "encode_s": round(encode_s, 4),
        "decode_s": round(decode_s, 4),
        "max_engine_call_s": round(max(run["calls"]), 4),
        "rejected": dict(run["counts"]),
        "crash": run["crash"],
        "best": run["best"],
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--per-category", type=int, default=20)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    codec, rng = Codec(), np.random.default_rng(7)
    tried, rejected = Counter(), Counter()
    rows, calls, hang = [], [], None
    nulls = 0
    for fault in (*FAULTS, "healthy"):
        for seed in range(1, a.seeds + 1):
            records = _simulate(fault, seed, a.seconds)
            clean = _run(records, "sim")
            extra, got = _wrong(records, rng, a.per_category, codec)
            tried += got
            run = _run(_merge(records, extra), "sim")
            rejected += run["counts"]
            calls += run["calls"]
            try:
                codec.decode(None)
            except DecodeError:
                nulls += 1
            rows.append(
                {
                    "fault": fault,
                    "seed": seed,
                    "wrong_records": len(extra),
                    "crash": run["crash"] or clean["crash"],
                    "clean_best": clean["best"],
                    "best": run["best"],
                    "culprit_changed": run["best"] != clean["best"],
                    "false_root_causes": len(run["causes"]) * (fault == "healthy"),
                    "culprits_outside_job": sorted(
                        r for r in run["ranks"] if not 0 <= r < WORLD
                    ),
                    "max_engine_call_s": round(max(run["calls"]), 4),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            if fault == "gpu-hang" and hang is None:
                hang = records
    huge = _huge(hang or _simulate("gpu-hang", 1, a.seconds), codec)
    print(json.dumps({"huge_batch": huge}), flush=True)
    ms = np.asarray(calls)
    summary = {
        "runs": len(rows),
        "tried_per_category": dict(sorted(tried.items())),
        "null_values_tried": nulls,
        "rejected_per_reason": dict(sorted(rejected.items())),
        "crashes": sum(bool(r["crash"]) for r in rows),
        "false_root_causes": sum(r["false_root_causes"] for r in rows),
        "culprit_changes": sum(r["culprit_changed"] for r in rows),
        "culprits_outside_job": sum(len(r["culprits_outside_job"]) for r in rows),
        "engine_call_p99_s": round(float(np.percentile(ms, 99)), 4),
        "engine_call_max_s": round(float(ms.max()), 4),
        "huge_batch": huge,
    }
    print(json.dumps(summary, indent=2))
    doc = {"commit": source_commit(), "args": vars(a) | {"out": str(a.out)}, **summary}
    a.out.write_text(json.dumps({**doc, "rows": rows}, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
