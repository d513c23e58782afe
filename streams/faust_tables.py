"""A Faust table whose changelog writes can be awaited before a commit.

A Faust table sends each change to its changelog through the producer's
buffer (``send_soon``), drained by a background task. ``Producer.flush``
does not wait for that buffer to empty: it gives up as soon as one message
takes more than 0.1 s to leave it (``ProducerBuffer.flush_atmost``), which
a loaded worker or a multi-megabyte engine snapshot easily does. Committing
the source offsets after such a flush can make the offsets durable while
the snapshot that holds those records is still in the buffer: a worker
killed then restarts past records that no snapshot holds, and the job's
engine starts afresh without them (no topology, an incident lost).

:class:`AwaitedTable` keeps the future of every changelog message it sends;
:meth:`AwaitedTable.written` waits until the broker acknowledged all of
them. The worker awaits it before it commits offsets (snapshots) and after
it records what it sent (the ``emitted`` table).
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
from faust.types import CodecArg, FutureMessage

__all__ = ["AwaitedTable", "awaited_table"]


class AwaitedTable(faust.Table[Any, Any]):
    """A table that remembers its unacknowledged changelog messages."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As ``faust.Table``, with nothing in flight."""
        super().__init__(*args, **kwargs)
        self.in_flight: list[FutureMessage] = []

    def send_changelog(
        self,
        partition: int | None,
        key: Any,
        value: Any,
        key_serializer: CodecArg | None = None,
        value_serializer: CodecArg | None = None,
    ) -> FutureMessage:
        """Send one change to the changelog and keep its future."""
        fut: FutureMessage = super().send_changelog(
            partition, key, value, key_serializer, value_serializer
        )
        self.in_flight.append(fut)
        return fut

    async def written(self) -> None:
        """Return once every change sent so far is acknowledged by the broker
        (a failed send raises: the caller must not commit past it)."""
        pending, self.in_flight = self.in_flight, []
        if pending:
            await asyncio.gather(*pending)


def awaited_table(app: faust.App, name: str, **kwargs: Any) -> AwaitedTable:
    """Define an :class:`AwaitedTable` on ``app``, as ``app.Table`` does."""
    table = AwaitedTable(app, name=name, beacon=app.tables.beacon, **kwargs)
    app.tables.add(table)
    return table
