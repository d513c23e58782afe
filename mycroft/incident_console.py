"""The live incident console of ``mycroft incidents follow`` and ``mycroft demo``.

:class:`Console` takes records as they arrive, keeps them in an
:class:`~mycroft.incident_book.IncidentBook` and prints each new incident,
each revision (saying what changed), each closure (when and why) and each
anomaly, in words or as one JSON object per line. Before
:meth:`Console.start` it only records, so a console can read a topic's
history silently and print from then on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import IO

from mycroft.incident_book import Change, IncidentBook
from mycroft.incident_card import anomaly_json, placement_of, revision_json
from mycroft.incident_text import closed_line, iso, live_lines
from mycroft.schemas.records import Anomaly, Record, RootCause


def _job_of(record: Record) -> str | None:
    return getattr(record, "job_id", None)


def _change(prev: RootCause | None, now: RootCause) -> str:
    """``revised: culprit was rank 3 on host-0`` (empty for a new incident)."""
    if prev is None:
        return ""
    old = prev.culprits[0] if prev.culprits else None
    new = now.culprits[0] if now.culprits else None
    if old is None or new is None:
        return "revised"
    if old.subject() != new.subject():
        return f"revised: culprit was {old.subject()}"
    if old.component != new.component:
        return f"revised: component was {old.component.value}"
    if abs(old.confidence - new.confidence) >= 0.005:
        return f"revised: confidence was {old.confidence:.2f}"
    return "revised"


class Console:
    """Print incidents and anomalies as they arrive.

    Args:
        out: where lines go (stdout); ``err``: where status lines go (stderr).
        as_json: one JSON object per line instead of words.
        job_id: only this job's records (None: every job).
        anomalies: print anomalies too, at most ``max_anomalies`` (None: all).
        stamp: when a record happened in words, from its time in ns
            (default: ISO-8601).
    """

    def __init__(
        self,
        out: IO[str] | None = None,
        *,
        err: IO[str] | None = None,
        as_json: bool = False,
        job_id: str | None = None,
        anomalies: bool = True,
        max_anomalies: int | None = None,
        stamp: Callable[[int], str] = iso,
    ) -> None:
        self.book = IncidentBook()
        self.hidden_anomalies = 0
        self._out = out or sys.stdout
        self._err = err or sys.stderr
        self._json = as_json
        self._job = job_id
        self._anomalies = anomalies
        self._max_anomalies = max_anomalies
        self._shown_anomalies = 0
        self._stamp = stamp
        self._live = False

    def start(self) -> None:
        """Print what arrives from now on."""
        self._live = True

    def status(self, text: str) -> None:
        """A line about the console itself (to ``err``)."""
        print(text, file=self._err, flush=True)

    def show(self, record: Record) -> Change:
        """Record one arriving record; print it when it is news."""
        if self._job is not None and _job_of(record) != self._job:
            return Change.IGNORED
        prev = None
        if isinstance(record, RootCause):
            known = self.book.incidents.get(record.incident_id)
            prev = known.latest if known is not None else None
        change = self.book.add(record)
        if not self._live or change is Change.IGNORED:
            return change
        if isinstance(record, Anomaly):
            self._anomaly(record)
        elif isinstance(record, RootCause):
            self._root_cause(record, prev, change)
        return change

    def _anomaly(self, a: Anomaly) -> None:
        if not self._anomalies:
            return
        if self._max_anomalies is not None and (
            self._shown_anomalies >= self._max_anomalies
        ):
            self.hidden_anomalies += 1
            return
        self._shown_anomalies += 1
        if self._json:
            self._print(json.dumps({"event": "anomaly", "anomaly": anomaly_json(a)}))
        else:
            self._print("\n".join(live_lines(a, self._stamp(a.detected_ns))))

    def _root_cause(
        self, rc: RootCause, prev: RootCause | None, change: Change
    ) -> None:
        note = "closed" if rc.is_closed else _change(prev, rc)
        if self._json:
            doc = {
                "event": change.value,
                "change": note,
                "root_cause": revision_json(rc),
            }
            self._print(json.dumps(doc))
            return
        if rc.is_closed and rc.closed_ns is not None:
            self._print(closed_line(rc, self._stamp(rc.closed_ns)))
            return
        where = placement_of(self.book, rc.job_id)
        lines = live_lines(rc, self._stamp(rc.resolved_ns), note, where)
        self._print("\n".join(lines))

    def _print(self, text: str) -> None:
        print(text, file=self._out, flush=True)
