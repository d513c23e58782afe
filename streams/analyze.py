"""``mycroft analyze PATH... [--json]``: run the core on recorded traces.

Records are fed in trace order with trace time as ``now``; the analyzer is
also evaluated every 100 ms of trace time so hangs fire without new events.
With ``--json`` the output is ``{"anomalies": [...], "root_causes": [...]}``:
one root-cause row per culprit of the *latest revision* of each incident,
incidents ordered by detection time, each incident's best culprit first.
Times are Unix epoch seconds of the trace clock. No truth file is ever read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from mycroft.producers.tracefile import read_records
from mycroft.schemas.records import Anomaly, Record, RootCause
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.engine import Analyzer

_CADENCE_NS = 100_000_000
_JOB_RECORDS = ("StateBatch", "CompletionBatch", "Heartbeat", "Topology")


def _job_of(record: Record) -> str:
    header = getattr(record, "header", None)
    return str(header.job_id if header is not None else getattr(record, "job_id", ""))


def run(
    records: Iterable[tuple[int, Record]], config: DetectorConfig | None = None
) -> tuple[list[Anomaly], dict[str, RootCause]]:
    """Feed ``(ts_ns, record)`` pairs to one Analyzer per job.

    Returns:
        Every anomaly emitted, and the latest revision of each incident.
    """
    analyzers: dict[str, Analyzer] = {}
    anomalies: list[Anomaly] = []
    causes: dict[str, RootCause] = {}
    next_eval = -1

    def tick(now_ns: int) -> None:
        for an in analyzers.values():
            for f in an.evaluate(now_ns):
                if isinstance(f, RootCause):
                    causes[f.incident_id] = f
                else:
                    anomalies.append(f)

    for ts_ns, rec in records:
        if type(rec).__name__ not in _JOB_RECORDS:
            continue  # recorded findings of a live run are not inputs
        if next_eval < 0:
            next_eval = ts_ns
        while next_eval <= ts_ns:
            tick(next_eval)
            next_eval += _CADENCE_NS
        job = _job_of(rec)
        an = analyzers.get(job)
        if an is None:
            an = analyzers[job] = Analyzer(job, config)
        an.ingest(rec, ts_ns)
    if next_eval >= 0:
        tick(next_eval)
    return anomalies, causes


def to_json(anomalies: list[Anomaly], causes: dict[str, RootCause]) -> dict[str, Any]:
    """Return the ``--json`` document (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    for rc in sorted(causes.values(), key=lambda c: (c.detected_ns, c.incident_id)):
        for i, c in enumerate(rc.culprits):
            rows.append(
                {
                    "incident_id": rc.incident_id,
                    "revision": rc.revision,
                    "best": i == 0,
                    "rank": c.rank,
                    "host": c.host,
                    "peer": c.peer,
                    "channel": c.channel,
                    "component": c.component.value,
                    "kind": c.kind.value,
                    "confidence": c.confidence,
                    "reason": c.reason,
                    "onset_s": rc.onset_ns / 1e9,
                    "detected_at_s": rc.detected_ns / 1e9,
                    "resolved_at_s": rc.resolved_ns / 1e9,
                }
            )
    return {
        "anomalies": [
            {
                "anomaly_id": a.anomaly_id,
                "job_id": a.job_id,
                "kind": a.kind.value,
                "detector": a.detector,
                "comms": list(a.comms),
                "ranks": list(a.ranks),
                "onset_s": a.onset_ns / 1e9,
                "detected_at_s": a.detected_ns / 1e9,
                "summary": a.summary,
                "score": a.score,
            }
            for a in anomalies
        ],
        "root_causes": rows,
    }


def _print_human(anomalies: list[Anomaly], causes: dict[str, RootCause]) -> None:
    for a in anomalies:
        print(
            f"[{a.detected_ns / 1e9:.3f}] {a.kind.value:<8} {a.detector}: {a.summary}"
        )
    for rc in sorted(causes.values(), key=lambda c: c.detected_ns):
        print(
            f"\nincident {rc.incident_id} (rev {rc.revision}): {rc.kind.value}, "
            f"detected {rc.detection_latency_s:.2f} s after onset"
        )
        for c in rc.culprits:
            flow = f" flow ->{c.peer} ch{c.channel}" if c.peer is not None else ""
            print(
                f"  rank {c.rank} on {c.host}: {c.component.value}{flow} "
                f"({c.confidence:.2f}) {c.reason}"
            )
        for e in rc.evidence[:8]:
            print(f"    - {e.fact}")
    if not anomalies:
        print("no anomalies")


def main(argv: Sequence[str] | None = None) -> int:
    """Analyze trace files; return 0 (findings or not), 2 on bad usage."""
    ap = argparse.ArgumentParser(prog="mycroft analyze", description=__doc__)
    ap.add_argument("paths", nargs="+", help="trace files (.myct, .gz)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    anomalies: list[Anomaly] = []
    causes: dict[str, RootCause] = {}
    for path in args.paths:
        a, c = run(read_records(path))
        anomalies += a
        causes.update(c)
    if args.json:
        json.dump(to_json(anomalies, causes), sys.stdout, indent=2)
        print()
    else:
        _print_human(anomalies, causes)
    return 0
