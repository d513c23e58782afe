"""Anomalies and root causes in words, for every command that prints them.

``mycroft analyze``, ``mycroft incidents`` and ``mycroft demo`` print through
these functions, so an incident reads the same offline, on the console and
in the demo. Times are ISO-8601 UTC; comm ids are not printed in text.
"""

from __future__ import annotations

from datetime import UTC, datetime

from mycroft.schemas.records import Anomaly, Culprit, RootCause

LIVE_EVIDENCE = 4
"""Evidence lines under a root cause on a live console."""

_LIVE_PAD = " " * 15


def iso(ns: int) -> str:
    """``2026-12-03T05:50:01.250Z`` for a Unix time in ns."""
    moment = datetime.fromtimestamp(ns / 1e9, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def flow_text(c: Culprit) -> str:
    """`` flow 3 -> 4 ch1`` when the culprit names a flow its subject does not."""
    if c.peer is None or c.scope == "link":
        return ""
    ch = "" if c.channel is None else f" ch{c.channel}"
    return f" flow {c.rank} -> {c.peer}{ch}"


def culprit_text(c: Culprit) -> str:
    """``rank 3 on host-0: nic flow 3 -> 4 ch1 (0.90)``."""
    return f"{c.subject()}: {c.component.value}{flow_text(c)} ({c.confidence:.2f})"


def culprit_line(c: Culprit) -> str:
    """:func:`culprit_text` followed by the culprit's reason."""
    return f"{culprit_text(c)} {c.reason}".rstrip()


def anomaly_line(a: Anomaly) -> str:
    """``[2026-...Z] hang     hang: op 5 stuck`` (detection time)."""
    return f"[{iso(a.detected_ns)}] {a.kind.value:<8} {a.detector}: {a.summary}"


def incident_lines(rc: RootCause, max_evidence: int = 8) -> list[str]:
    """An incident's latest revision: headline, every culprit, the evidence."""
    lines = [
        f"incident {rc.incident_id} (rev {rc.revision}): {rc.kind.value}, "
        f"detected {rc.detection_latency_s:.2f} s after onset"
    ]
    lines += [f"  {culprit_line(c)}" for c in rc.culprits]
    lines += [f"    - {e.fact}" for e in rc.evidence[:max_evidence]]
    return lines


def live_lines(record: Anomaly | RootCause, stamp: str, change: str = "") -> list[str]:
    """What a live console prints for one arriving record.

    ``stamp`` says when (``t=  12.3s`` in the demo, a time of day when
    following); ``change`` (``culprit was rank 3 on host-0``) follows a
    revision's headline.
    """
    if isinstance(record, Anomaly):
        return [f"  {stamp}  anomaly   {record.kind.value:<9} {record.summary}"]
    head = f"  {stamp}  ROOT CAUSE rev {record.revision}: {record.kind.value}"
    best = record.culprits[0] if record.culprits else None
    if best is None:
        return [head + " (no culprit)"]
    note = f" [{change}]" if change else ""
    lines = [f"{head} -> {culprit_text(best)}{note}"]
    lines.append(f"{_LIVE_PAD}incident {record.incident_id} of job {record.job_id}")
    lines += [f"{_LIVE_PAD}evidence: {e.fact}" for e in record.evidence[:LIVE_EVIDENCE]]
    return lines
