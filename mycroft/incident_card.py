"""One incident whole: the card ``mycroft incidents show`` prints, and its JSON.

The card leads with the headline (what, where, how sure) and the next step
(:mod:`mycroft.verdict`), then the culprit (what is blamed, where it sits:
host, GPU, NIC or link), the component, fault kind and confidence, the other
suspects, the evidence chain (upstream last), the latencies, the anomalies it
explains and every revision. The JSON document holds the same, with times as
Unix seconds (``*_s``) and ISO-8601 strings (``*_at``) and comm ids as numbers
(``comms``, ``comm``) and as the text writes them (``comms_hex``,
``comm_hex``: ``0x`` and 16 hex digits); culprits have the keys of a
``mycroft analyze --json`` root-cause row.
"""

from __future__ import annotations

from typing import Any

from mycroft.incident_book import Incident, IncidentBook
from mycroft.incident_text import anomaly_line, culprit_line, culprit_text, iso
from mycroft.schemas.records import Anomaly, Culprit, Evidence, RootCause
from mycroft.schemas.text import comm_hex
from mycroft.verdict import (
    Place,
    Placement,
    folded,
    headline,
    next_step,
    unique,
)


def placement_of(book: IncidentBook, job_id: str) -> Placement:
    """Where the ranks of ``job_id`` run, from the topology records read."""

    def place(rank: int) -> Place | None:
        found = book.placement(job_id, rank)
        return None if found is None else Place(found[0], found[1].gpu, found[1].nic)

    return place


def _where(book: IncidentBook, job_id: str, c: Culprit) -> str:
    """``host node-1, GPU gpu5, NIC mlx5_0`` for the culprit's rank (or link)."""
    if c.scope == "nic" and c.device:
        parts = [f"NIC {c.device} of host {c.host}"]
    elif c.scope == "host":
        parts = [f"host {c.host}"]
    else:
        parts = [f"host {c.host}"]
        placed = book.placement(job_id, c.rank)
        if placed is not None:
            parts += [f"GPU {placed[1].gpu}", f"NIC {placed[1].nic}"]
    if c.peer is not None:
        peer = book.placement(job_id, c.peer)
        on = f" on {peer[0]}" if peer is not None else ""
        ch = "" if c.channel is None else f", channel {c.channel}"
        parts.append(f"link {c.rank} -> {c.peer}{on}{ch}")
    return ", ".join(parts)


def status(inc: Incident, now_ns: int, ttl_s: float) -> str:
    """``open`` or ``closed``."""
    return "open" if inc.is_open(now_ns, ttl_s) else "closed"


def closed_text(rc: RootCause) -> str:
    """``2026-01-01T00:00:12.300Z: quiet for 5.1 s of event time (...)`` for a
    closed revision; empty otherwise."""
    if not rc.is_closed or rc.closed_ns is None:
        return ""
    return f"{iso(rc.closed_ns)}: {rc.close_reason or 'no reason given'}"


def closure_json(rc: RootCause) -> dict[str, Any]:
    """``state``, ``closed_at_s``, ``closed_at`` and ``close_reason`` of a
    revision (the last three null while open)."""
    closed = rc.closed_ns
    return {
        "state": rc.state.value,
        "closed_at_s": None if closed is None else closed / 1e9,
        "closed_at": None if closed is None else iso(closed),
        "close_reason": rc.close_reason,
    }


def card_lines(
    book: IncidentBook,
    inc: Incident,
    now_ns: int,
    ttl_s: float,
    verbose: bool = False,
) -> list[str]:
    """The text card of one incident: the headline and next step first
    (:mod:`mycroft.verdict`), then the details; anomalies folded unless
    ``verbose``."""
    rc = inc.latest
    placement = placement_of(book, rc.job_id)
    lines = [headline(rc, placement)]
    if rc.culprits:
        lines.append(f"  next step    {next_step(rc.culprits[0], placement)}")
    lines += [
        f"incident {rc.incident_id}",
        f"  job          {rc.job_id} ({status(inc, now_ns, ttl_s)})",
        f"  kind         {rc.kind.value}",
    ]
    if closed_text(rc):
        lines.append(f"  closed       {closed_text(rc)}")
    if rc.culprits:
        best = rc.culprits[0]
        lines += [
            f"  culprit      {best.subject()}",
            f"  where        {_where(book, rc.job_id, best)}",
            f"  component    {best.component.value}",
            f"  fault        {best.kind.value}",
            f"  confidence   {best.confidence:.2f}",
        ]
        if best.reason:
            lines.append(f"  why          {best.reason}")
    else:
        lines.append("  culprit      none named")
    lines += [
        f"  onset        {iso(rc.onset_ns)}",
        f"  detected     {iso(rc.detected_ns)}, "
        f"{rc.detection_latency_s:.2f} s after onset",
        f"  root cause   {iso(rc.resolved_ns)}, "
        f"{rc.rca_latency_s:.2f} s after detection",
    ]
    if len(rc.culprits) > 1:
        lines.append("  other suspects:")
        lines += [f"    {culprit_line(c)}" for c in rc.culprits[1:]]
    if rc.evidence:
        lines.append("  evidence (each step follows the wait to the next):")
        lines += [f"    - {fact}" for fact in unique(e.fact for e in rc.evidence)]
    cited = book.cited(inc)
    if cited:
        lines.append(f"  anomalies ({len(cited)}):")
        rows = [f"    {anomaly_line(a)}" for a in cited]
        lines += folded(rows, verbose=verbose)
    lines.append(f"  revisions ({len(inc.revisions)}):")
    for r in inc.revisions:
        best_text = culprit_text(r.culprits[0]) if r.culprits else "no culprit"
        if r.is_closed and r.closed_ns is not None:
            best_text = f"closed at {iso(r.closed_ns)}"
        lines.append(f"    rev {r.revision}  {iso(r.resolved_ns)}  {best_text}")
    return lines


def culprit_json(c: Culprit) -> dict[str, Any]:
    """A culprit as ``mycroft analyze --json`` writes it."""
    return {
        "rank": c.rank,
        "host": c.host,
        "scope": c.scope,
        "device": c.device,
        "ranks": list(c.ranks),
        "subject": c.subject(),
        "peer": c.peer,
        "channel": c.channel,
        "component": c.component.value,
        "kind": c.kind.value,
        "confidence": c.confidence,
        "reason": c.reason,
        "rules": list(c.rules),
    }


def anomaly_json(a: Anomaly) -> dict[str, Any]:
    """An anomaly as ``mycroft analyze --json`` writes it."""
    return {
        "anomaly_id": a.anomaly_id,
        "job_id": a.job_id,
        "kind": a.kind.value,
        "detector": a.detector,
        "comms": list(a.comms),
        "comms_hex": [comm_hex(c) for c in a.comms],
        "ranks": list(a.ranks),
        "onset_s": a.onset_ns / 1e9,
        "detected_at_s": a.detected_ns / 1e9,
        "onset_at": iso(a.onset_ns),
        "detected_at": iso(a.detected_ns),
        "summary": a.summary,
        "score": a.score,
    }


def evidence_json(e: Evidence) -> dict[str, Any]:
    """One step of the evidence chain."""
    return {
        "fact": e.fact,
        "rank": e.rank,
        "comm": e.comm,
        "comm_hex": None if e.comm is None else comm_hex(e.comm),
        "op_seq": e.op_seq,
    }


def revision_json(rc: RootCause) -> dict[str, Any]:
    """One revision: its times, latencies, culprits and evidence."""
    return {
        "incident_id": rc.incident_id,
        "revision": rc.revision,
        "job_id": rc.job_id,
        "kind": rc.kind.value,
        "onset_s": rc.onset_ns / 1e9,
        "detected_at_s": rc.detected_ns / 1e9,
        "resolved_at_s": rc.resolved_ns / 1e9,
        "onset_at": iso(rc.onset_ns),
        "detected_at": iso(rc.detected_ns),
        "resolved_at": iso(rc.resolved_ns),
        "detection_latency_s": rc.detection_latency_s,
        "rca_latency_s": rc.rca_latency_s,
        "culprits": [culprit_json(c) for c in rc.culprits],
        "evidence": [evidence_json(e) for e in rc.evidence],
        "anomaly_ids": list(rc.anomaly_ids),
    } | closure_json(rc)


def summary_json(inc: Incident, now_ns: int, ttl_s: float) -> dict[str, Any]:
    """One row of ``mycroft incidents list --json``."""
    rc = inc.latest
    best = rc.culprits[0] if rc.culprits else None
    return {
        "incident_id": rc.incident_id,
        "job_id": rc.job_id,
        "status": status(inc, now_ns, ttl_s),
        "kind": rc.kind.value,
        "revision": rc.revision,
        "revisions": len(inc.revisions),
        "subject": best.subject() if best else None,
        "component": best.component.value if best else None,
        "confidence": best.confidence if best else None,
        "detected_at": iso(rc.detected_ns),
        "detection_latency_s": rc.detection_latency_s,
        "rca_latency_s": rc.rca_latency_s,
    } | closure_json(rc)


def incident_json(
    book: IncidentBook, inc: Incident, now_ns: int, ttl_s: float
) -> dict[str, Any]:
    """``mycroft incidents show --json``: latest revision, every one, anomalies."""
    return summary_json(inc, now_ns, ttl_s) | {
        "latest": revision_json(inc.latest),
        "history": [revision_json(r) for r in inc.revisions],
        "anomalies": [anomaly_json(a) for a in book.cited(inc)],
    }
