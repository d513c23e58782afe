"""``mycroft analyze PATH... [--json]``: run the core on recorded traces.

Records are fed in trace order with trace time as ``now``; the analyzer is
also evaluated every 100 ms of trace time so hangs fire without new events.
Text output writes times as ISO-8601 UTC with the seconds since the job's
first record in the trace (``2026-01-01T00:00:07.800Z (+7.800 s)``) and comm
ids as ``0x`` and 16 hex digits. With ``--json`` the output is
``{"anomalies": [...], "root_causes": [...], "jobs": {...}, "pauses": [...]}``:
one root-cause
row per culprit of the *latest revision* of each incident, incidents ordered
by detection time, each incident's best culprit first, with the scoring
rules behind it (``rules``, ``streams/core/README.md``); ``jobs`` gives each
job's first record (``start_s``, ``start_at``); ``pauses`` the recurring
pauses of the jobs' own rhythm (a checkpoint, an evaluation phase), which
are costs, not incidents (``streams/pause_report.py``). Each row also says
where its incident stands at the end of the trace: ``state`` (``open``, or ``closed``
once nothing fired for ``incident_quiet_s`` of event time; the latest
revision is then the closing one), ``closed_at_s``, ``closed_at`` and
``close_reason`` (null while open). Times are Unix epoch seconds
of the trace clock (``*_s``) and the same as ISO-8601 strings (``*_at``).
No truth file is ever read.

Exit status: 0 when no root cause names a culprit (anomalies alone may be
printed), 3 when one does; bad usage and unreadable input exit as every
``mycroft`` command does (README, "Exit codes").
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from mycroft import report
from mycroft.cli_parser import mycroft_parser
from mycroft.incident_card import anomaly_json, closure_json, culprit_json
from mycroft.incident_text import anomaly_line, incident_lines, iso
from mycroft.producers.tracefile import read_records
from mycroft.schemas.records import Anomaly, Record, RootCause, Topology
from mycroft.streams.core.config import DetectorConfig, with_overrides
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.event_time import EventTimeConfig, on_grid
from mycroft.streams.pause_report import JobCosts, job_costs, pause_lines, pauses_json
from mycroft.verdict import Place, folded

_CADENCE_NS = 100_000_000
_MAX_GAP_NS = EventTimeConfig().max_gap_ns
_JOB_RECORDS = ("StateBatch", "CompletionBatch", "Heartbeat", "Topology")


def _job_of(record: Record) -> str:
    header = getattr(record, "header", None)
    return str(header.job_id if header is not None else getattr(record, "job_id", ""))


class Replay:
    """Feed ``(ts_ns, record)`` pairs, in trace order, to one Analyzer per job.

    The trace time is ``now``; every analyzer is evaluated each ``cadence_ns``
    of trace time (at multiples of it in epoch time, as the live worker's
    event clock) so hangs fire without new events. ``mycroft analyze`` and the
    in-process fault campaign (``bench/campaign``) both drive the core through
    this class, so they share one code path.
    """

    def __init__(
        self, config: DetectorConfig | None = None, cadence_ns: int = _CADENCE_NS
    ) -> None:
        self.config = config
        self.cadence_ns = cadence_ns
        self.analyzers: dict[str, Analyzer] = {}
        self.anomalies: list[Anomaly] = []
        self.causes: dict[str, RootCause] = {}
        self.revisions: list[RootCause] = []  # every revision, in order
        self.first_resolved_ns: dict[str, int] = {}
        self.start_ns: dict[str, int] = {}  # job -> time of its first record
        self.eval_wall_s: list[float] = []  # wall time of each evaluate round
        self._next_eval = -1

    def _tick(self, now_ns: int) -> None:
        t0 = time.perf_counter()
        for an in self.analyzers.values():
            for f in an.evaluate(now_ns):
                if isinstance(f, RootCause):
                    self.causes[f.incident_id] = f
                    self.revisions.append(f)
                    self.first_resolved_ns.setdefault(f.incident_id, f.resolved_ns)
                else:
                    self.anomalies.append(f)
        self.eval_wall_s.append(time.perf_counter() - t0)

    def feed(self, ts_ns: int, rec: Record) -> None:
        """Ingest one record at trace time ``ts_ns`` (evaluating on the way)."""
        if type(rec).__name__ not in _JOB_RECORDS:
            return  # recorded findings of a live run are not inputs
        if self._next_eval < 0:
            self._next_eval = on_grid(ts_ns, self.cadence_ns)
        if ts_ns - self._next_eval > _MAX_GAP_NS:
            # A stretch without records is evaluated for _MAX_GAP_NS, then
            # the grid jumps to the next record, as the live event clock
            # does: a trace's cost follows its records, not its time span.
            end = self._next_eval + _MAX_GAP_NS
            while self._next_eval <= end:
                self._tick(self._next_eval)
                self._next_eval += self.cadence_ns
            skip = (ts_ns - self._next_eval) // self.cadence_ns
            self._next_eval += skip * self.cadence_ns
        while self._next_eval <= ts_ns:
            self._tick(self._next_eval)
            self._next_eval += self.cadence_ns
        job = _job_of(rec)
        an = self.analyzers.get(job)
        if an is None:
            an = self.analyzers[job] = Analyzer(job, self.config)
            self.start_ns[job] = ts_ns
        an.ingest(rec, ts_ns)

    def write(self, record: Record, ts_ns: int) -> None:
        """``RecordWriter`` protocol: lets a simulator write straight in."""
        self.feed(ts_ns, record)

    def close(self) -> None:
        """``RecordWriter`` protocol: run the final evaluation."""
        self.finish()

    def finish(self) -> tuple[list[Anomaly], dict[str, RootCause]]:
        """Evaluate once more; return every anomaly and each incident's latest."""
        if self._next_eval >= 0:
            self._tick(self._next_eval)
            self._next_eval = -1
        return self.anomalies, self.causes


def run(
    records: Iterable[tuple[int, Record]], config: DetectorConfig | None = None
) -> tuple[list[Anomaly], dict[str, RootCause]]:
    """Feed ``(ts_ns, record)`` pairs to one Analyzer per job.

    Returns:
        Every anomaly emitted, and the latest revision of each incident.
    """
    rp = Replay(config)
    for ts_ns, rec in records:
        rp.feed(ts_ns, rec)
    return rp.finish()


def to_json(
    anomalies: list[Anomaly],
    causes: dict[str, RootCause],
    first_resolved_ns: dict[str, int] | None = None,
    start_ns: dict[str, int] | None = None,
    pauses: JobCosts | None = None,
) -> dict[str, Any]:
    """Return the ``--json`` document (see the module docstring).

    ``first_resolved_ns`` (incident id -> time of its first revision) adds
    ``first_resolved_at_s`` to each row; ``start_ns`` (job -> time of its
    first record) adds ``jobs``; ``pauses`` (job -> recurring pauses) adds
    ``pauses``.
    """
    first = first_resolved_ns or {}
    rows: list[dict[str, Any]] = []
    for rc in sorted(causes.values(), key=lambda c: (c.detected_ns, c.incident_id)):
        for i, c in enumerate(rc.culprits):
            rows.append(
                {
                    "incident_id": rc.incident_id,
                    "revision": rc.revision,
                    "best": i == 0,
                    **culprit_json(c),
                    "onset_s": rc.onset_ns / 1e9,
                    "detected_at_s": rc.detected_ns / 1e9,
                    "resolved_at_s": rc.resolved_ns / 1e9,
                    "first_resolved_at_s": first.get(rc.incident_id, rc.resolved_ns)
                    / 1e9,
                    "onset_at": iso(rc.onset_ns),
                    "detected_at": iso(rc.detected_ns),
                    "resolved_at": iso(rc.resolved_ns),
                    **closure_json(rc),
                }
            )
    doc: dict[str, Any] = {
        "anomalies": [anomaly_json(a) for a in anomalies],
        "root_causes": rows,
    }
    if start_ns is not None:
        doc["jobs"] = {
            job: {"start_s": ns / 1e9, "start_at": iso(ns)}
            for job, ns in sorted(start_ns.items())
        }
    if pauses is not None:
        doc["pauses"] = pauses_json(pauses)
    return doc


Places = dict[tuple[str, int], Place]
"""(job id, rank) -> where the rank runs, from the traces' topology records."""


def _place(places: Places, rec: Record) -> None:
    if isinstance(rec, Topology):
        for r in rec.ranks:
            places[(rec.job_id, r.rank)] = Place(rec.host, r.gpu, r.nic)


def _placed(places: Places, job_id: str, rank: int) -> Place | None:
    return places.get((job_id, rank))


def _print_human(
    anomalies: list[Anomaly],
    causes: dict[str, RootCause],
    start_ns: dict[str, int],
    places: Places | None = None,
    verbose: bool = False,
) -> None:
    """The verdicts first (headline, next step, evidence), then the
    anomalies, folded unless ``verbose``."""
    where = places or {}
    for rc in sorted(causes.values(), key=lambda c: c.detected_ns):
        lines = incident_lines(
            rc, start_ns=start_ns.get(rc.job_id),
            placement=functools.partial(_placed, where, rc.job_id),
            max_evidence=100 if verbose else 8,
        )  # fmt: skip
        print("\n".join(lines))
        print()
    if not anomalies:
        print("no anomalies")
        return
    if not causes:
        print(f"no root cause named; {len(anomalies)} anomalies:")
    else:
        print(f"anomalies ({len(anomalies)}):")
    rows = [f"  {anomaly_line(a, start_ns.get(a.job_id))}" for a in anomalies]
    print("\n".join(folded(rows, verbose=verbose)))


def _merge(
    rp: Replay, first: dict[str, int], starts: dict[str, int], pauses: JobCosts
) -> None:
    """Fold one trace's first answers, job starts and pauses into the totals."""
    first.update(rp.first_resolved_ns)
    pauses.update(job_costs(rp.analyzers))
    for job, ns in rp.start_ns.items():
        starts[job] = min(ns, starts.get(job, ns))


def exit_code(causes: dict[str, RootCause]) -> int:
    """0 when no root cause names a culprit, 3 when one does."""
    from mycroft.cli_errors import ExitCode  # noqa: PLC0415 (the CLI's codes)

    found = any(rc.culprits for rc in causes.values())
    return int(ExitCode.ROOT_CAUSE if found else ExitCode.OK)


def main(argv: Sequence[str] | None = None) -> int:
    """Analyze trace files; return 0 (no root cause) or 3 (root causes found)."""
    ap = mycroft_parser(
        "analyze",
        "Find anomalies and root causes in recorded trace files (or PyTorch "
        "Flight Recorder dumps) offline, with the same detectors and rules as "
        "the stream workers. Exit status: 0 when no root cause names a "
        "culprit, 3 when one does.",
    )
    ap.add_argument(
        "paths", nargs="*", help="trace files (.trace; .trace.gz compressed)"
    )
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument(
        "--verbose",
        action="store_true",
        help="print every anomaly and evidence line (default: the first few)",
    )
    ap.add_argument(
        "--flight-recorder",
        metavar="DIR",
        help="analyze a folder of PyTorch Flight Recorder dumps instead",
    )
    ap.add_argument(
        "--world-size", type=int, default=0, help="with --flight-recorder: job ranks"
    )
    ap.add_argument(
        "--report",
        metavar="DIR",
        help="also write DIR/index.html, each incident with figures "
        "(the 'report' extra: matplotlib)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a detector threshold (repeatable or comma-separated; "
        "keys: DetectorConfig in streams/core/config.py), as a worker's "
        "--detector does",
    )
    args = ap.parse_args(argv)
    try:
        config = with_overrides(DetectorConfig(), args.set)
    except ValueError as exc:
        ap.error(str(exc))
    if args.report:
        if args.flight_recorder:
            ap.error("--report reads trace files, not --flight-recorder dumps")
        report.require_matplotlib()
    if args.flight_recorder:
        from mycroft.streams import flight_recorder  # noqa: PLC0415 (imports us)

        fr_args = [args.flight_recorder, "--world-size", str(args.world_size)]
        return flight_recorder.main(fr_args + (["--json"] if args.json else []))
    if not args.paths:
        ap.error("give trace files, or --flight-recorder DIR")
    anomalies: list[Anomaly] = []
    causes: dict[str, RootCause] = {}
    reports: list[report.IncidentData] = []
    first: dict[str, int] = {}
    starts: dict[str, int] = {}
    places: Places = {}
    pauses: JobCosts = {}
    for path in args.paths:
        rp = Replay(config)
        for ts_ns, rec in read_records(path):
            _place(places, rec)
            rp.feed(ts_ns, rec)
        a, c = rp.finish()
        if args.report:  # a second pass: the figures read the records again
            records = (rec for _, rec in read_records(path))
            reports += report.collect(records, list(c.values()), a)
        anomalies += a
        causes.update(c)
        _merge(rp, first, starts, pauses)
    if args.json:
        json.dump(
            to_json(anomalies, causes, first, starts, pauses), sys.stdout, indent=2
        )
        print()
    else:
        _print_human(anomalies, causes, starts, places, args.verbose)
        print("\n".join(["", *pause_lines(pauses)]) if pauses else "", end="")
    if args.report:
        page = report.write(args.report, reports, anomalies)
        sys.stdout.flush()
        print(f"report: {page}", file=sys.stderr)
    return exit_code(causes)
