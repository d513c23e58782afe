"""``mycroft analyze --flight-recorder DIR [--json]``: PyTorch Flight Recorder dumps.

Reads one dump per rank (``<prefix><rank>``; pickle versions 2.x or the JSON
form), skipping and reporting empty, truncated, foreign or unsupported files
(never a crash; pickles are read with an unpickler that builds no objects but
plain containers). gloo's malformed ``pg_config`` (one ``''`` group, ranks
``'[]'``) is tolerated: members come from a valid ``pg_config`` entry, the
world (``--world-size``, dump names) for the default group, else the ranks
whose entries name the group.

Entries become Mycroft records on the dumps' clock: a Topology, and per
event a StateBatch (rc rows: issued/done per rank x group; op rows: ops in
flight, nflows=0) and a CompletionBatch for retired ops. gloo records no end
time: a retired op is taken to end at its last member's arrival (at most the
rank's next issue). A rank is alive until its dump's mtime, at most
``DUMP_HORIZON_NS`` after the newest entry (a copied file's mtime is the
copy's, not the dump's). The same core
(``streams.analyze.run``) names culprits; FR-only evidence is added here:
the waits of blocked ranks are followed across groups (``fr_waits``) to a
rank without a dump (``process``), an idle one (``host``) or a cycle of
waits (``config``), ahead of the core's rows; ops whose sizes, dtypes or
names differ across ranks are listed (``fr_checks``), and a core culprit
without a dump is relabelled ``process``. Output as ``mycroft analyze``
plus a ``flight_recorder`` section (dumps, missing, skipped, blocked ops,
mismatches, unknown op names, p2p records).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mycroft.cli_parser import mycroft_parser
from mycroft.producers.torch.frdump import FrDumps, FrEntry, load_dir, read_dump
from mycroft.producers.torch.tracer import comm_hash
from mycroft.schemas.columns import DONE_OP_COLUMNS, OP_COLUMNS, RC_COLUMNS, dtype_of
from mycroft.schemas.records import (
    BatchHeader,
    CommMembership,
    CompletionBatch,
    RankTopology,
    Record,
    StateBatch,
    Topology,
)
from mycroft.streams import fr_checks, fr_lateness, fr_waits
from mycroft.streams.analyze import run, to_json

__all__ = ["FrDumps", "FrEntry", "analyze", "load_dir", "main", "read_dump"]

HOST = "flight-recorder"
_GAP_NS, _GAP_FILL_NS = 200_000_000, 15_000_000_000
DUMP_HORIZON_NS = 60_000_000_000
"""Latest a dump is taken to be written after the newest entry of the
directory (60 s). A file's mtime is when it was last written: a dump copied
later (scp, tar, object storage) says days, and every 100 ms tick up to it
would be evaluated. Past the longest hang threshold (10 s) a longer silence
changes no verdict, so analysis cost follows the entries, never the files."""


def _ends(d: FrDumps) -> dict[tuple[int, str, int], int]:
    """Estimated end of each retired op (its last member's arrival)."""
    arrive: dict[tuple[str, int], int] = {}
    for rows in d.entries.values():
        for e in rows:
            key = (e.pg, e.seq)
            arrive[key] = max(arrive.get(key, 0), e.created_ns)
    out: dict[tuple[int, str, int], int] = {}
    for rank, rows in d.entries.items():
        for i, e in enumerate(rows):
            if not e.retired:
                continue
            end = e.completed_ns or arrive[(e.pg, e.seq)]
            if i + 1 < len(rows) and not e.completed_ns:
                end = min(end, max(rows[i + 1].created_ns, e.created_ns))
            out[(rank, e.pg, e.seq)] = max(end, e.created_ns)
    return out


def to_records(d: FrDumps, job_id: str = "flight-recorder") -> list[tuple[int, Record]]:
    """Convert the dumps into ``(ts_ns, record)`` pairs in time order."""
    ends = _ends(d)
    events: list[tuple[int, int, FrEntry]] = []  # (ts, 0 issue / 1 end, entry)
    for rows in d.entries.values():
        for e in rows:
            events.append((e.created_ns, 0, e))
            if (e.rank, e.pg, e.seq) in ends:
                events.append((ends[(e.rank, e.pg, e.seq)], 1, e))
    events.sort(key=lambda x: (x[0], x[1]))
    if not events:
        return []
    dumped = _dump_times(d, events[-1][0])
    last = max([events[-1][0], *dumped.values()])
    t0 = events[0][0]
    out: list[tuple[int, Record]] = [(t0 - 1, _topology(d, job_id, t0 - 1))]
    issued: dict[tuple[int, str], int] = {}
    done: dict[tuple[int, str], int] = {}
    flight: dict[tuple[int, str, int], FrEntry] = {}
    finished: list[tuple[FrEntry, int]] = []
    seq_no = 0
    i = 0
    for tick in _ticks([t for t, _, _ in events], last):
        while i < len(events) and events[i][0] <= tick:
            ts, what, e = events[i]
            key = (e.rank, e.pg)
            if what == 0:
                issued[key] = max(issued.get(key, -1), e.seq)
                flight[(e.rank, e.pg, e.seq)] = e
            else:
                done[key] = max(done.get(key, -1), e.seq)
                flight.pop((e.rank, e.pg, e.seq), None)
                finished.append((e, ts))
            i += 1
        seq_no += 1
        head = BatchHeader(job_id, HOST, 0, seq_no, tick, 100)
        out.append((tick, _state(d, head, (issued, done, dumped), flight)))
        if finished:
            seq_no += 1
            head = BatchHeader(job_id, HOST, 0, seq_no, tick, 100)
            out.append((tick, _completions(head, finished)))
            finished = []
    return out


def _ticks(times: list[int], last: int) -> list[int]:
    """Every event time, plus a tick each 200 ms for 15 s into every gap."""
    uniq = sorted(set(times) | {last})
    out: list[int] = []
    for a, b in zip(uniq, [*uniq[1:], uniq[-1]], strict=True):
        out.append(a)
        t = a + _GAP_NS
        while t < b and t - a <= _GAP_FILL_NS:
            out.append(t)
            t += _GAP_NS
    return out


def _topology(d: FrDumps, job_id: str, ts: int) -> Topology:
    ranks = []
    for r in range(d.world):
        comms = tuple(
            CommMembership(
                comm_hash(pg),
                "world" if members == tuple(range(d.world)) and pg == "0" else desc,
                len(members),
                members.index(r),
                members,
            )
            for pg, members in sorted(d.groups.items())
            if r in members
            for desc in [d.roles.get(pg, "") or f"pg{pg}"]
        )
        ranks.append(RankTopology(r, r, "", "", comms))
    return Topology(job_id, HOST, "", ts, tuple(ranks))


def _dump_times(d: FrDumps, newest_ns: int) -> dict[int, int]:
    """When each rank's dump was written: its file's mtime, at most
    ``DUMP_HORIZON_NS`` after the newest entry of any dump."""
    return {r: min(t, newest_ns + DUMP_HORIZON_NS) for r, t in d.mtime_ns.items()}


def _state(
    d: FrDumps,
    head: BatchHeader,
    seqs: tuple[dict[tuple[int, str], int], dict[tuple[int, str], int], dict[int, int]],
    flight: dict[tuple[int, str, int], FrEntry],
) -> StateBatch:
    """Rank-state rows (issued, done, up to each dump's time) and ops in flight."""
    issued, done, dumped = seqs
    tick = head.tick_ns
    rc = [
        (r, comm_hash(pg), issued.get((r, pg), -1), done.get((r, pg), -1), tick)
        for r in sorted(d.entries)
        for pg, members in sorted(d.groups.items())
        if r in members and tick <= dumped.get(r, tick)
    ]
    ops = [
        (e.rank, comm_hash(e.pg), e.seq, e.kind, 0, 0, e.nbytes, e.created_ns, 0, 0)
        for e in flight.values()
        if e.known  # counted in FrDumps.unknown_ops, reported by analyze
    ]
    return StateBatch(
        head,
        np.array(rc, dtype=dtype_of(RC_COLUMNS)),
        np.array(ops, dtype=dtype_of(OP_COLUMNS)),
    )


def _completions(head: BatchHeader, done: list[tuple[FrEntry, int]]) -> CompletionBatch:
    rows = [
        (e.rank, comm_hash(e.pg), e.seq, e.kind, e.nbytes, e.created_ns, e.created_ns)
        + (end, 0)
        for e, end in done
        if e.known
    ]
    return CompletionBatch(head, np.array(rows, dtype=dtype_of(DONE_OP_COLUMNS)))


def blocked(d: FrDumps) -> list[dict[str, Any]]:
    """Per group, the first op some member is still in (not retired)."""
    out = []
    for pg, members in sorted(d.groups.items()):
        open_ = [e for r in d.entries for e in d.entries[r] if e.pg == pg]
        waiting = [e for e in open_ if not e.retired]
        if not waiting:
            continue
        seq = min(e.seq for e in waiting)
        at = [e for e in open_ if e.seq == seq]
        arrived = sorted({e.rank for e in at})
        out.append(
            {
                "group": pg,
                "role": d.roles.get(pg, ""),
                "collective_seq_id": seq + 1,
                "op": at[0].op,
                "input_sizes": sorted({e.sizes for e in at}),
                "waiting_ranks": sorted({e.rank for e in waiting if e.seq == seq}),
                "not_arrived": [r for r in members if r not in arrived],
                "no_dump": [r for r in members if r not in d.entries],
                "states": fr_checks.states(at),
            }
        )
    return out


def analyze(d: FrDumps, job_id: str = "flight-recorder") -> dict[str, Any]:
    """Run the core on the converted dumps; the ``--json`` document."""
    anomalies, causes = run(to_records(d, job_id))
    doc = to_json(anomalies, causes)
    stuck = blocked(d)
    missing = set(d.missing)
    for row in doc["root_causes"]:
        if row["rank"] in missing and row["component"] == "host":
            row["component"] = "process"
            row["reason"] = (
                "no Flight Recorder dump while peers wait on it: the process died "
                f"(core: {row['reason']})"
            )
    odd = fr_checks.mismatches(d)
    doc["root_causes"] += _mismatch_culprits(doc["root_causes"], odd, job_id)
    doc["root_causes"] = fr_waits.with_chain(d, doc["root_causes"], job_id)
    fr_lateness.relabel_slow(d, doc["root_causes"])
    doc["flight_recorder"] = {
        "world_size": d.world,
        "dumps": sorted(d.entries),
        "missing": sorted(missing),
        "skipped": d.skipped,
        "blocked": stuck,
        "mismatches": odd,
        "unknown_ops": dict(sorted(d.unknown_ops.items())),
        "p2p_records": sum(len(v) for v in d.p2p.values()),
    }
    return doc


def _cause(job_id: str, key: str, rank: int, **fields: Any) -> dict[str, Any]:
    """A root-cause row shaped as ``mycroft analyze`` writes them."""
    when = fields.pop("when_s")
    return {
        "incident_id": f"{job_id}:{fields['kind']}:{key}:{rank}",
        "revision": 0,
        "best": False,
        "rank": rank,
        "host": "",
        "peer": None,
        "channel": None,
        **fields,
        "onset_s": when,
        "detected_at_s": when,
        "resolved_at_s": when,
    }


def _mismatch_culprits(
    named: list[dict[str, Any]], odd: list[dict[str, Any]], job_id: str
) -> list[dict[str, Any]]:
    """FR-only evidence the core has no columns for (output sizes, dtypes,
    op names): the ranks in the minority of the first mismatched op."""
    first = next((m for m in odd if m["minority"]), None)
    if first is None or any(r["kind"] == "mismatch" for r in named):
        return []
    rows = []
    for rank in first["ranks"]:
        why = (
            f"{first['field']} of op #{first['collective_seq_id']} of group "
            f"{first['group']}: {first['found'][str(rank)]}, the others "
            f"{first['expected']}"
        )
        rows.append(
            _cause(
                job_id,
                "fr-mismatch",
                rank,
                component="config",
                kind="mismatch",
                confidence=round(0.9 / len(first["ranks"]), 3),
                reason=why,
                when_s=first["issued_s"],
            )
        )
    if rows and not named:
        rows[0]["best"] = True
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``DIR [--json] [--world-size N]``; as ``mycroft analyze``: 0 when no
    culprit is named, 3 when one is, 4 when DIR is unusable."""
    ap = mycroft_parser(
        "analyze --flight-recorder",
        "Name the rank a hung job waits on from its PyTorch Flight Recorder dumps.",
    )
    ap.add_argument("dir", type=Path, help="folder of per-rank dumps <prefix><rank>")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument(
        "--world-size", type=int, default=0, help="ranks in the job (finds lost ones)"
    )
    args = ap.parse_args(argv)
    if not args.dir.is_dir():
        print(f"mycroft analyze: {args.dir} is not a folder of dumps", file=sys.stderr)
        return 4  # bad input (README, exit codes)
    d = load_dir(args.dir, args.world_size)
    doc = analyze(d)
    found = 3 if doc["root_causes"] else 0  # README, exit codes
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
        return found
    fr = doc["flight_recorder"]
    print(f"dumps of ranks {fr['dumps']}; missing {fr['missing']}")
    for s in fr["skipped"]:
        print(f"skipped {s['file']}: {s['reason']}")
    if fr_checks.unknown_line(d):
        print(fr_checks.unknown_line(d))
    for m in fr["mismatches"]:
        print(
            f"mismatch: {m['field']} of #{m['collective_seq_id']} of group "
            f"{m['group']}: {m['found']}, the others {m['expected']}"
        )
    for b in fr["blocked"]:
        print(
            f"blocked: {b['op']} seq {b['collective_seq_id']} of group {b['group']} "
            f"({b['role']}): waiting {b['waiting_ranks']}, "
            f"not arrived {b['not_arrived']}, no dump {b['no_dump']}"
            + (f", states {b['states']}" if b["states"] else "")
        )
    for row in doc["root_causes"]:
        mark = "*" if row["best"] else " "
        print(
            f"{mark} rank {row['rank']}: {row['kind']} {row['component']} "
            f"({row['confidence']:.2f}) {row['reason']}"
        )
    if not doc["root_causes"]:
        print("no culprit named")
    return found


if __name__ == "__main__":
    sys.exit(main())
