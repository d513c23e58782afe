"""Incidents from root causes and anomalies, and the console that prints them."""

from __future__ import annotations

import io
import json
from dataclasses import replace

from mycroft.incident_book import Change, IncidentBook
from mycroft.incident_console import Console
from mycroft.incident_text import incident_lines, iso
from mycroft.schemas.records import Anomaly, Culprit, Evidence, RootCause
from mycroft.schemas.vocab import Component, FaultKind

S = 1_000_000_000
T0 = 1_800_000_000 * S


def _rc(iid: str, revision: int = 0, job: str = "job", at_s: float = 0) -> RootCause:
    culprit = Culprit(3, "node-1", Component.GPU, FaultKind.HANG, 0.7, reason="stuck")
    return RootCause(
        iid, revision, job, FaultKind.HANG, (culprit,), (Evidence("rank 3 froze"),),
        ("a1",), T0, T0 + S, T0 + 2 * S, emitted_wall_ns=T0 + int(at_s * S),
    )  # fmt: skip


def _anomaly() -> Anomaly:
    return Anomaly("a1", "job", FaultKind.HANG, (7,), (3,), T0, T0 + S, "hang", "x")


def test_revisions_replace_and_duplicates_are_ignored() -> None:
    book = IncidentBook()
    assert book.add(_rc("i", 0)) is Change.NEW
    assert book.add(_rc("i", 2)) is Change.REVISED
    assert book.add(_rc("i", 1)) is Change.REVISED
    assert book.add(_rc("i", 1)) is Change.IGNORED
    assert [r.revision for r in book.incidents["i"].revisions] == [0, 1, 2]
    assert book.incidents["i"].latest.revision == 2
    assert book.add(_anomaly()) is Change.ANOMALY
    assert book.add(_anomaly()) is Change.IGNORED
    assert book.cited(book.incidents["i"]) == [_anomaly()]


def test_open_recent_and_by_job() -> None:
    """Records of a writer that never sends a closed revision (RootCause.1-3):
    open while younger than the TTL."""
    book = IncidentBook()
    for rc in (_rc("new", at_s=1000), _rc("old", at_s=0), _rc("b", job="b", at_s=990)):
        book.add(replace(rc, states_closure=False))
    now = T0 + 1001 * S
    ids = [i.incident_id for i in book.select(now_ns=now, since_s=100)]
    assert ids == ["b", "new"]  # same detection time: by id
    assert [
        i.incident_id for i in book.select(now_ns=now, open_only=True, ttl_s=5)
    ] == ["new"]
    assert {i.incident_id for i in book.select(now_ns=now)} == {"new", "old", "b"}
    assert [i.incident_id for i in book.select(job_id="b", now_ns=now)] == ["b"]
    assert [i.incident_id for i in book.find("ne")] == ["new"]
    assert len(book.find("")) == 3


def test_console_prints_news_only_after_start() -> None:
    out = io.StringIO()
    console = Console(out, stamp=lambda ns: f"t={(ns - T0) / S:.1f}s")
    console.show(_rc("i", 0))
    assert out.getvalue() == ""
    console.start()
    nic = replace(_rc("i", 1).culprits[0], component=Component.NIC)
    console.show(replace(_rc("i", 1), culprits=(nic,)))
    console.show(_anomaly())
    text = out.getvalue()
    assert (
        "t=2.0s  ROOT CAUSE rev 1: hang at rank 3 on host node-1: the NIC, "
        "likely (0.70)" in text
    )
    assert "[revised: component was gpu]" in text
    assert "t=1.0s  anomaly hang: x" in text


def test_console_json_lines_and_anomaly_limit() -> None:
    out = io.StringIO()
    console = Console(out, as_json=True, max_anomalies=0)
    console.start()
    console.show(_rc("i"))
    console.show(_anomaly())
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["event"] == "new" and doc["root_cause"]["incident_id"] == "i"
    assert doc["root_cause"]["resolved_at"] == iso(T0 + 2 * S)
    assert console.hidden_anomalies == 1


def test_the_analyze_block() -> None:
    assert incident_lines(_rc("i"), start_ns=T0 - 5 * S) == [
        "hang at rank 3 on host node-1: the GPU, likely (0.70)",
        "  next step: drain node-1 and run the GPU diagnostics on rank 3's GPU "
        "(dcgmi diag -r 3; nvidia-smi -q for Xid and ECC errors)",
        "  incident i (rev 0): hang since 2027-01-15T08:00:00.000Z (+5.000 s), "
        "detected 1.00 s after onset, root cause 1.00 s later",
        "  rank 3 on node-1: gpu (0.70) stuck",
        "    - rank 3 froze",
    ]
    assert iso(T0) == "2027-01-15T08:00:00.000Z"
    assert incident_lines(_rc("i"))[2].startswith(
        "  incident i (rev 0): hang since 2027-01-15T08:00:00.000Z, detected"
    )
