"""Where a worker is in each source topic partition: read to its end, or not.

The event clock of a job (``core/event_time.py``) releases records only up to
what every source stream can no longer undercut, and a stream whose topic
partition is read *to its end* holds nothing back. Getting "read to its end"
wrong is getting a verdict wrong: a job's state batches released ahead of its
topology record, still unread, are rows of undeclared ranks to the record
gate. So both ends of the comparison come from the broker's view, never from
how far the consumer happened to prefetch:

* **the end** of a partition is its high watermark as the last fetch reported
  it, or, while no fetch has (a worker that just started or recovered, or one
  whose fetches a backlog keeps busy), the broker's answer to an end-offset
  request;
* **where reading began**, for a partition nothing was processed from yet, is
  the group's committed offset (the consumer seeks there on assignment), or
  the partition's first offset when there is none or retention deleted the
  records up to it (``consumer_auto_offset_reset`` is ``earliest``). Not
  the consumer's position: records fetched into the stream buffer but not
  processed have already moved it on, and a partition whose few records (a
  new job's topology) sat in the buffer looked read to its end.

An end or a beginning the broker does not give (it is unreachable) leaves the
partition *behind*: the jobs' clocks wait, as they must for records that may
exist, and go on once it answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from faust.types import TP

log = logging.getLogger(__name__)

Position = Literal["end"] | int
"""``end``: every record written so far was processed; else the offset of the
last record processed (``-1``: none yet)."""

BROKER_TIMEOUT_S = 1.0
"""Longest a tick waits for the broker's answer to an offsets request."""
BROKER_RETRY_S = 5.0
"""After a request the broker did not answer, how long none is made (each
would hold a tick for ``BROKER_TIMEOUT_S``)."""


def committed_offset(consumer: Any, tp: TP) -> int | None:
    """The group's committed offset of ``tp`` as the consumer last saw it.

    Faust keeps it from its seek to the committed offsets on assignment (and
    from its own commits) in ``Consumer._committed_offset``; there is no
    public accessor. ``tests/unit/streams/test_read_positions.py`` checks
    that the installed Faust still has it.
    """
    offsets: Mapping[TP, int | None] = getattr(consumer, "_committed_offset", {})
    offset = offsets.get(tp)
    return int(offset) if offset is not None and offset >= 0 else None


class ReadPositions:
    """Processed offsets per source partition, and their place against its end."""

    def __init__(
        self, consumer: Callable[[], Any], timeout_s: float = BROKER_TIMEOUT_S
    ) -> None:
        self.consumer_of = consumer  # the app's, created when first used
        self.timeout_s = timeout_s
        self.done: dict[TP, int] = {}  # last offset processed
        self.began: dict[TP, int] = {}  # where reading began, nothing processed
        self.asked = 0  # broker requests made (end or first offsets)
        self.retry_at = 0.0  # monotonic time before which none is made

    def processed(self, tp: TP, offset: int) -> None:
        """Record that the record at ``offset`` of ``tp`` was processed."""
        self.done[tp] = offset

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget revoked partitions (a later assignment starts afresh)."""
        parts = set(partitions)
        self.done = {tp: o for tp, o in self.done.items() if tp.partition not in parts}
        self.began = {
            tp: o for tp, o in self.began.items() if tp.partition not in parts
        }

    @property
    def consumer(self) -> Any:
        """The Faust consumer whose offsets these are."""
        return self.consumer_of()

    async def positions(self, tps: Iterable[TP]) -> dict[TP, Position]:
        """Each partition of ``tps`` read to its end, or its last processed offset."""
        tps = list(tps)
        ends = await self.ends(tps)
        starts = await self.starts([tp for tp in tps if tp not in self.done])
        out: dict[TP, Position] = {}
        for tp in tps:
            done = self.done.get(tp, -1)
            start = done + 1 if tp in self.done else starts.get(tp)
            end = ends.get(tp)
            read_all = end is not None and start is not None and start >= end
            out[tp] = "end" if read_all else done
        return out

    async def ends(self, tps: list[TP]) -> dict[TP, int]:
        """End offsets: the last fetch's high watermarks, else the broker's."""
        out: dict[TP, int] = {}
        for tp in tps:
            try:
                hw = self.consumer.highwater(tp)
            except (AssertionError, KeyError, AttributeError, TypeError):
                hw = None
            if hw is not None:
                out[tp] = int(hw)
        unknown = [tp for tp in tps if tp not in out]
        if unknown:
            out |= await self._ask(self.consumer.highwaters, unknown)
        return out

    async def starts(self, tps: list[TP]) -> dict[TP, int]:
        """Where reading began in partitions nothing was processed from: the
        committed offset, or the first one when retention deleted the records
        up to the commit (or there is none); without the broker's answer, the
        committed offset alone."""
        out = {tp: self.began[tp] for tp in tps if tp in self.began}
        unknown = [tp for tp in tps if tp not in out]
        first = (
            await self._ask(self.consumer.earliest_offsets, unknown) if unknown else {}
        )
        for tp in unknown:
            committed = committed_offset(self.consumer, tp)
            if tp in first:  # settled: kept until the partition is revoked
                out[tp] = self.began[tp] = max(first[tp], committed or 0)
            elif committed is not None:  # asked again next time
                out[tp] = committed
        return out

    async def _ask(self, request: Any, tps: list[TP]) -> dict[TP, int]:
        """One broker request for ``tps``; what it answered (nothing on failure,
        nor for ``BROKER_RETRY_S`` after one)."""
        if time.monotonic() < self.retry_at:
            return {}
        self.asked += 1
        try:
            answer = await asyncio.wait_for(request(*tps), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - unanswered: the partitions wait
            log.debug("offsets of %s unknown for now: %r", tps, exc)
            self.retry_at = time.monotonic() + BROKER_RETRY_S
            return {}
        return {tp: int(answer[tp]) for tp in tps if answer.get(tp) is not None}
