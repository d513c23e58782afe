"""Checks the rings a real NCCL job left (``gpu_check.sh``); exit 1 when not sane.

    python gpu_ring_check.py RING_DIR --ranks N [--rings R] [--ops MIN] [--net]

Sane: ``R`` version-3 rings (default ``N``: one per rank; nccl-tests drives all
GPUs from one process, one ring), no corrupt or overwritten slot, a COMM of
``N`` ranks, at least ``MIN`` ops issued and done, every FLOW_PROGRESS with
``total >= G >= T >= D >= 0``, every flow done with all its steps, nothing
dropped; with ``--net`` (NVLink/SHM off) flows and bytes must be there.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from mycroft.producers.ring import RingReader
from mycroft.producers.ring_layout import (
    Beat,
    Comm,
    FlowDone,
    FlowProgress,
    FlowSteps,
    OpDone,
    OpIssued,
    RingRecord,
)


def read(path: Path) -> tuple[RingReader, list[RingRecord]]:
    """Every record of one ring."""
    reader = RingReader(path, flow_steps=True)
    return reader, reader.poll()


def problems(path: Path, args: argparse.Namespace) -> list[str]:
    """What is wrong with one ring (empty: sane); prints its summary."""
    reader, recs = read(path)
    kinds = Counter(type(r).__name__ for r in recs)
    print(f"{path.name}: rank {reader.header.rank}, {len(recs)} records {dict(kinds)}")
    bad = []
    if reader.header.version != 3:
        bad.append(f"layout version {reader.header.version}, not 3")
    if reader.corrupt or reader.overwritten:
        bad.append(f"{reader.corrupt} corrupt, {reader.overwritten} overwritten")
    if not any(isinstance(r, Comm) and r.nranks == args.ranks for r in recs):
        bad.append(f"no COMM of {args.ranks} ranks")
    for kind, name in ((OpIssued, "OP_ISSUED"), (OpDone, "OP_DONE")):
        if sum(isinstance(r, kind) for r in recs) < args.ops:
            bad.append(f"fewer than {args.ops} {name}")
    prog = [r for r in recs if isinstance(r, FlowProgress)]
    last = {(p.comm, p.seq, p.channel, p.direction, p.peer): p for p in prog}
    bad += [
        f"invariant broken: {p}"
        for p in prog
        if not p.total >= p.gpu_ready >= p.transmitted >= p.done >= 0
    ]
    for d in (r for r in recs if isinstance(r, FlowDone)):
        p = last.get((d.comm, d.seq, d.channel, d.direction, d.peer))
        if p is None or d.chunks != p.total or d.ts_ns < d.first_ns:
            bad.append(f"flow done short or out of order: {d} (last progress {p})")
    nbytes = sum(
        s.nbytes
        for s in {
            (s.comm, s.seq, s.channel, s.direction): s
            for s in recs
            if isinstance(s, FlowSteps)
        }.values()
    )
    print(f"  flows {len(last)}, bytes moved {nbytes}")
    if args.net and (not last or nbytes == 0):
        bad.append("network transport forced but no flow or no bytes recorded")
    beats = [r for r in recs if isinstance(r, Beat)]
    if not beats:
        bad.append("no BEAT")
    elif (b := beats[-1]).dropped_comms or b.dropped_ops or b.dropped_flows:
        bad.append(f"pool exhausted: {b}")
    reader.close()
    return bad[:10]


def main() -> int:
    """Check every ring in RING_DIR."""
    ap = argparse.ArgumentParser()
    ap.add_argument("ring_dir", type=Path)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--rings", type=int, help="rings expected (default: --ranks)")
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--net", action="store_true")
    args = ap.parse_args()
    rings = sorted(args.ring_dir.glob("*.ring"))
    want = args.rings or args.ranks
    bad = [] if len(rings) == want else [f"{len(rings)} rings, not {want}"]
    for path in rings:
        bad += [f"{path.name}: {p}" for p in problems(path, args)]
    for line in bad:
        print(f"  BAD {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
