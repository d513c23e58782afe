"""``mycroft incidents``: an incident is closed by its closed revision."""

from __future__ import annotations

import io
import json
from dataclasses import replace

from mycroft.incident_book import Change, IncidentBook
from mycroft.incident_card import card_lines, incident_json, summary_json
from mycroft.incident_console import Console
from mycroft.incident_text import iso
from mycroft.incidents import _closed_note
from mycroft.schemas.records import Culprit, Evidence, RootCause
from mycroft.schemas.vocab import Component, FaultKind, IncidentState

S = 1_000_000_000
T0 = 1_800_000_000 * S
WHY = "quiet for 5.1 s of event time (incident_quiet_s 5)"
DAY = 86_400 * S


def _rc(revision: int = 0) -> RootCause:
    culprit = Culprit(3, "node-1", Component.GPU, FaultKind.HANG, 0.7, reason="stuck")
    return RootCause(
        "i", revision, "job", FaultKind.HANG, (culprit,), (Evidence("rank 3 froze"),),
        ("a1",), T0, T0 + S, T0 + 2 * S, emitted_wall_ns=T0 + 2 * S,
    )  # fmt: skip


def _closed(revision: int = 1) -> RootCause:
    return replace(
        _rc(revision),
        state=IncidentState.CLOSED,
        closed_ns=T0 + 9 * S,
        close_reason=WHY,
        emitted_wall_ns=T0 + 9 * S,
    )


def _book(*records: RootCause) -> IncidentBook:
    book = IncidentBook()
    for r in records:
        book.add(r)
    return book


def test_an_incident_is_open_until_its_closed_revision_whatever_its_age() -> None:
    book = _book(_rc(0))
    inc = book.incidents["i"]
    assert inc.is_open(T0 + DAY) and inc.closed is None  # no TTL guess
    assert book.add(_closed()) is Change.CLOSED
    assert not inc.is_open(T0 + 10 * S) and inc.closed == _closed()
    assert book.add(_closed()) is Change.IGNORED
    assert [i.incident_id for i in book.select(now_ns=T0 + 10 * S)] == ["i"]
    assert book.select(now_ns=T0 + 10 * S, open_only=True) == []


def test_list_rows_say_when_and_why_it_closed() -> None:
    book = _book(_rc(0), _closed())
    row = summary_json(book.incidents["i"], T0 + 10 * S, 600.0)
    assert (row["status"], row["state"], row["revision"]) == ("closed", "closed", 1)
    assert row["closed_at"] == iso(T0 + 9 * S) and row["closed_at_s"] == 1.8e9 + 9
    assert row["close_reason"] == WHY
    assert _closed_note(row) == f"  closed {iso(T0 + 9 * S)}: {WHY}"
    still = summary_json(_book(_rc(0)).incidents["i"], T0 + DAY, 600.0)
    assert (still["status"], still["closed_at"], _closed_note(still)) == (
        "open", None, ""
    )  # fmt: skip


def test_show_prints_the_closure_and_the_closing_revision() -> None:
    book = _book(_rc(0), _closed())
    inc = book.incidents["i"]
    lines = card_lines(book, inc, T0 + 10 * S, 600.0)
    assert "  job          job (closed)" in lines
    assert f"  closed       {iso(T0 + 9 * S)}: {WHY}" in lines
    assert lines[-1] == f"    rev 1  {iso(T0 + 2 * S)}  closed at {iso(T0 + 9 * S)}"
    doc = incident_json(book, inc, T0 + 10 * S, 600.0)
    assert doc["latest"]["state"] == "closed"
    assert [r["state"] for r in doc["history"]] == ["open", "closed"]
    assert doc["history"][0]["closed_at"] is None


def test_follow_prints_the_closure() -> None:
    out = io.StringIO()
    console = Console(out, stamp=lambda ns: f"t={(ns - T0) / S:.1f}s")
    console.start()
    console.show(_rc(0))
    assert console.show(_closed()) is Change.CLOSED
    last = out.getvalue().splitlines()[-1]
    assert last == f"  t=9.0s  CLOSED rev 1: incident i of job job: {WHY}"
    out = io.StringIO()
    console = Console(out, as_json=True)
    console.start()
    console.show(_closed())  # a console started after the incident ended
    doc = json.loads(out.getvalue())
    assert (doc["event"], doc["change"]) == ("closed", "closed")
    assert doc["root_cause"]["close_reason"] == WHY
