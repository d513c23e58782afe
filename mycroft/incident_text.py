"""Anomalies and root causes in words, for every command that prints them.

``mycroft analyze``, ``mycroft incidents`` and ``mycroft demo`` print through
these functions, so an incident reads the same offline, on the console and
in the demo. Times are ISO-8601 UTC to the millisecond, followed by the
seconds since the job's first record where the command knows it
(``2026-01-01T00:00:07.800Z (+7.800 s)``); comm ids are ``0x`` and 16 hex
digits (:mod:`mycroft.schemas.text`).
"""

from __future__ import annotations

from mycroft.schemas.records import Anomaly, Culprit, RootCause
from mycroft.schemas.text import iso, when
from mycroft.verdict import Placement, headline, next_step, nowhere, unique

__all__ = [
    "LIVE_EVIDENCE",
    "anomaly_line",
    "closed_line",
    "culprit_line",
    "culprit_text",
    "detector_text",
    "flow_text",
    "incident_lines",
    "iso",
    "live_lines",
    "when",
]

LIVE_EVIDENCE = 4
"""Evidence lines under a root cause on a live console."""


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


def detector_text(a: Anomaly) -> str:
    """``hang``, or ``slowdown (slow_xfer)`` when the detector is not the kind."""
    kind = a.kind.value
    return kind if a.detector == kind else f"{kind} ({a.detector})"


def anomaly_line(a: Anomaly, start_ns: int | None = None) -> str:
    """``2026-...Z (+7.800 s)  hang: comm 0x... made no progress ...``.

    The time is the detection's; ``start_ns``, the job's first record, adds
    the seconds since it.
    """
    return f"{when(a.detected_ns, start_ns)}  {detector_text(a)}: {a.summary}"


def incident_lines(
    rc: RootCause,
    max_evidence: int = 8,
    start_ns: int | None = None,
    placement: Placement = nowhere,
) -> list[str]:
    """An incident's latest revision: the headline and next step
    (:mod:`mycroft.verdict`), the incident and its times (when it closed and
    why, once closed), every culprit, the evidence (each line once)."""
    lines = [headline(rc, placement)]
    if rc.culprits:
        lines.append(f"  next step: {next_step(rc.culprits[0], placement)}")
    lines.append(
        f"  incident {rc.incident_id} (rev {rc.revision}): {rc.kind.value} since "
        f"{when(rc.onset_ns, start_ns)}, detected {rc.detection_latency_s:.2f} s "
        f"after onset, root cause {rc.rca_latency_s:.2f} s later"
    )
    if rc.is_closed and rc.closed_ns is not None:
        why = rc.close_reason or "no reason given"
        lines.append(f"  closed {when(rc.closed_ns, start_ns)}: {why}")
    lines += [f"  {culprit_line(c)}" for c in rc.culprits]
    facts = unique(e.fact for e in rc.evidence)
    lines += [f"    - {fact}" for fact in facts[:max_evidence]]
    if len(facts) > max_evidence:
        lines.append(f"    ({len(facts) - max_evidence} more evidence lines)")
    return lines


def live_lines(
    record: Anomaly | RootCause,
    stamp: str,
    change: str = "",
    placement: Placement = nowhere,
) -> list[str]:
    """What a live console prints for one arriving record.

    ``stamp`` says when (:func:`when` of the record's time); ``change``
    (``culprit was rank 3 on host-0``) follows a revision's headline
    (:func:`mycroft.verdict.headline`), then the next step, the incident and
    the evidence, each line once. The lines under a root cause line up after
    the stamp.
    """
    if isinstance(record, Anomaly):
        return [f"  {stamp}  anomaly {detector_text(record)}: {record.summary}"]
    note = f" [{change}]" if change else ""
    head = f"  {stamp}  ROOT CAUSE rev {record.revision}: "
    lines = [head + headline(record, placement) + note]
    if not record.culprits:
        return lines
    pad = " " * (len(stamp) + 4)
    lines.append(f"{pad}next step: {next_step(record.culprits[0], placement)}")
    lines.append(f"{pad}incident {record.incident_id} of job {record.job_id}")
    facts = unique(e.fact for e in record.evidence)
    lines += [f"{pad}evidence: {fact}" for fact in facts[:LIVE_EVIDENCE]]
    return lines


def closed_line(rc: RootCause, stamp: str) -> str:
    """What a live console prints for an incident's closed revision."""
    why = rc.close_reason or "no reason given"
    return (
        f"  {stamp}  CLOSED rev {rc.revision}: incident {rc.incident_id} "
        f"of job {rc.job_id}: {why}"
    )
