"""An in-memory sink: the shared test double, and handy in notebooks."""

from __future__ import annotations

from dataclasses import dataclass, field

from mycroft.errors import SinkError
from mycroft.schemas.records import Anomaly, RootCause
from mycroft.sinks.base import SinkRecord


@dataclass
class MemorySink:
    """Keep what was written, flushed and the latest revision of each incident.

    Attributes:
        written: every record in the order :meth:`write` got it.
        flushed: the records that a :meth:`flush` covered, in order.
        flushes: how many times :meth:`flush` ran.
        closed: whether :meth:`close` ran.
    """

    written: list[SinkRecord] = field(default_factory=list)
    flushed: list[SinkRecord] = field(default_factory=list)
    flushes: int = 0
    closed: bool = False

    def write(self, record: SinkRecord) -> None:
        """Append ``record`` to :attr:`written`.

        Raises:
            SinkError: not retryable, after :meth:`close`.
        """
        if self.closed:
            raise SinkError("MemorySink is closed", retryable=False)
        self.written.append(record)

    def flush(self) -> None:
        """Move the records written since the last flush into :attr:`flushed`."""
        self.flushed.extend(self.written[len(self.flushed) :])
        self.flushes += 1

    def close(self) -> None:
        """Mark the sink closed."""
        self.closed = True

    @property
    def anomalies(self) -> dict[str, Anomaly]:
        """Anomalies by ``anomaly_id`` (a re-delivered one counts once)."""
        return {r.anomaly_id: r for r in self.written if isinstance(r, Anomaly)}

    @property
    def incidents(self) -> dict[str, RootCause]:
        """The highest revision of each incident, by ``incident_id``."""
        latest: dict[str, RootCause] = {}
        for r in self.written:
            if isinstance(r, RootCause):
                seen = latest.get(r.incident_id)
                if seen is None or r.revision >= seen.revision:
                    latest[r.incident_id] = r
        return latest
