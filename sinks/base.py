"""The one plug-in point of the sinks: a :class:`Sink` takes detection results.

A sink receives every :class:`~mycroft.schemas.records.Anomaly` and every
revision of every :class:`~mycroft.schemas.records.RootCause`. Writes may be
buffered; :meth:`Sink.flush` makes them durable or visible. Sinks must be
idempotent: the service delivers at least once, so a record may arrive again.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias, runtime_checkable

from mycroft.schemas.records import Anomaly, RootCause

SinkRecord: TypeAlias = Anomaly | RootCause
"""What a sink accepts: the detection results, never raw trace batches."""


@runtime_checkable
class Sink(Protocol):
    """A destination of detection results (Prometheus, OpenSearch, memory)."""

    def write(self, record: SinkRecord) -> None:
        """Accept one record; may buffer it until :meth:`flush`.

        Raises:
            SinkError: the record cannot be accepted; ``retryable`` says whether
                the same write may succeed later.
        """
        ...

    def flush(self) -> None:
        """Make every accepted record durable or visible.

        Raises:
            SinkError: as :meth:`write`. Records that failed retryably stay
                buffered, so calling ``flush`` again retries them.
        """
        ...

    def close(self) -> None:
        """Release connections and servers; later writes are an error."""
        ...


@runtime_checkable
class JobWatcher(Protocol):
    """A sink that tracks which jobs still run (the service feeds it heartbeats)."""

    def job_alive(self, job_id: str) -> None:
        """Note that ``job_id`` sent a record now."""
        ...
