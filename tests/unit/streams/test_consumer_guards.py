"""The consumer guards: only a snapshot commits offsets, and an uncommitted
partition is read from its first record after a rebalance."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from typing import Any

from aiokafka import AIOKafkaConsumer
from faust.transport.consumer import Consumer
from faust.types import TP

from mycroft.streams.consumer_guards import (
    seek_unsought_to_first,
    snapshot_commits_only,
)


class FakeConsumer:
    def __init__(self) -> None:
        self.committed: list[Any] = []

    async def commit(
        self, topics: Any = None, start_new_transaction: bool = True
    ) -> bool:
        self.committed.append(topics)
        return True

    async def on_stop(self) -> None:
        """What Faust's consumer does when it stops gracefully."""
        await self.commit(start_new_transaction=False)


def test_commits_without_topics_are_declined_and_counted() -> None:
    consumer, counts = FakeConsumer(), Counter[str]()
    snapshot_commits_only(consumer, counts)
    snapshot_commits_only(consumer, counts)  # once per consumer
    tps = {TP("raw.state", 3)}

    async def scenario() -> tuple[bool, bool]:
        await consumer.on_stop()
        declined = await consumer.commit()
        return declined, await consumer.commit(tps)

    assert asyncio.run(scenario()) == (False, True)
    assert consumer.committed == [tps]
    assert counts["commits_declined"] == 2


def test_fausts_own_commits_name_no_topics() -> None:
    # The commits the wrapper declines are those Faust makes by itself:
    # on a graceful stop, on a task error, on its timer. If Faust ever
    # passed topics there, those commits would go through again.
    for name in ("commit_and_end_transactions", "on_task_error", "_commit_handler"):
        method = getattr(Consumer, name)
        source = inspect.getsource(getattr(method, "fun", method))  # Service.task
        assert "self.commit(" in source
        call = source[source.index("self.commit(") :].split(")", 1)[0]
        assert "topics" not in call, (name, call)


class SeekingConsumer:
    """Faust's consumer as ``seek_unsought_to_first`` uses it."""

    def __init__(self, committed: dict[TP, int | None], first: dict[TP, int]) -> None:
        self.committed, self.first = committed, first
        self.seeks: list[tuple[TP, int]] = []

    async def seek_to_committed(self) -> dict[TP, int | None]:
        return self.committed

    async def earliest_offsets(self, *partitions: TP) -> dict[TP, int]:
        return {tp: self.first[tp] for tp in partitions}

    async def seek(self, partition: TP, offset: int) -> None:
        self.seeks.append((partition, offset))


def test_partitions_without_a_committed_offset_are_read_from_their_first() -> None:
    kept, none, zero, tick = (
        TP("raw.state", 0),
        TP("raw.state", 1),
        TP("raw.topology", 1),
        TP("tick", 1),
    )
    consumer = SeekingConsumer(
        {kept: 7, none: None, zero: 0, tick: None},
        {kept: 0, none: 12, zero: 0, tick: 40},
    )
    counts = Counter[str]()
    seek_unsought_to_first(consumer, ["raw.state", "raw.topology"], counts)
    seek_unsought_to_first(consumer, ["raw.state", "raw.topology"], counts)  # once
    got = asyncio.run(consumer.seek_to_committed())
    # What Faust's perform_seek reads is what aiokafka returned.
    assert got == {kept: 7, none: None, zero: 0, tick: None}
    # The partitions aiokafka left where the fetcher was: the raw ones go to
    # their first record; the committed one was moved by aiokafka; ticks
    # are not worth reading again.
    assert consumer.seeks == [(none, 12), (zero, 0)]
    assert counts["seeks_to_first"] == 2


def test_aiokafka_seeks_only_offsets_above_zero() -> None:
    # Why the guard exists, and why it works: if aiokafka ever seeks every
    # partition (or Faust stops calling the instance's seek_to_committed),
    # this fails and the guard can be reconsidered.
    seek = inspect.getsource(AIOKafkaConsumer.seek_to_committed)
    assert "if offset and offset > 0:" in seek
    perform = inspect.getsource(Consumer.perform_seek)
    assert "await self.seek_to_committed()" in perform
    # Records fetched while the flow is stopped are dropped, not kept.
    getmany = inspect.getsource(Consumer.getmany)
    assert "if self.flow_active:" in getmany
