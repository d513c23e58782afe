"""Size of the batched records of one 8-GPU host, from a simulated healthy job.

Usage: python bench/message_size.py [--out bench/results/message_size.json]

Runs the simulator in-process (64 ranks, tp 8 x pp 2 x dp 4, 30 s) and measures
every encoded StateBatch and CompletionBatch: wire bytes (single-object Avro)
and lz4-compressed bytes as the producer sends them, rows per batch, and bytes
per training iteration per host (the paper reports 46.8 KB).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import lz4.frame

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import CompletionBatch, StateBatch


def _stats(values: list[int]) -> dict[str, float]:
    return {
        "median": float(statistics.median(values)),
        "p90": float(sorted(values)[int(0.9 * (len(values) - 1))]),
        "max": float(max(values)),
    }


def measure(duration_s: float) -> dict[str, Any]:
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=duration_s, seed=1)
    writer = ListWriter()
    result = simulate(cfg, [], writer)
    codec = Codec()
    sizes: dict[str, dict[str, list[int]]] = {
        "StateBatch": {"wire": [], "lz4": [], "rc": [], "op": [], "flow": []},
        "CompletionBatch": {"wire": [], "lz4": [], "op": [], "flow": []},
    }
    total = total_lz4 = 0
    for _, record in writer.records:
        if not isinstance(record, StateBatch | CompletionBatch):
            continue
        wire = codec.encode(record)
        s = sizes[type(record).__name__]
        s["wire"].append(len(wire))
        s["lz4"].append(len(lz4.frame.compress(wire)))
        for group in ("rc", "op", "flow"):
            if group in s:
                s[group].append(len(getattr(record, group)))
        total += len(wire)
        total_lz4 += s["lz4"][-1]
    hosts = cfg.hosts
    return {
        "job": {
            "ranks": cfg.ranks,
            "tp": 8,
            "pp": 2,
            "dp": 4,
            "hosts": hosts,
            "duration_s": duration_s,
            "iterations": result.iterations,
            "interval_ms": cfg.interval_ms,
        },  # fmt: skip
        "per_message": {
            name: {k: _stats(v) for k, v in s.items() if v} for name, s in sizes.items()
        },
        "bytes_per_iteration_per_host": round(total / result.iterations / hosts),
        "bytes_per_iteration_per_host_lz4": round(
            total_lz4 / result.iterations / hosts
        ),
        "paper_bytes_per_iteration_per_machine": 46_800,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=Path("bench/results/message_size.json"))
    p.add_argument("--duration", type=float, default=30.0)
    args = p.parse_args()
    result = measure(args.duration)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["per_message"]["StateBatch"]["wire"]),
          result["bytes_per_iteration_per_host"])  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
