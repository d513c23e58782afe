"""ReadPositions: read to its end means every record was processed, not fetched."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping

from faust.transport.consumer import Consumer
from faust.types import TP

from mycroft.streams.read_positions import Position, ReadPositions, committed_offset

TOPO = TP("raw.topology", 6)
STATE = TP("raw.state", 6)


class FakeConsumer:
    """The consumer calls ReadPositions makes, with the broker's answers."""

    def __init__(
        self,
        fetched: Mapping[TP, int],
        broker_ends: Mapping[TP, int],
        first: Mapping[TP, int],
        committed: Mapping[TP, int | None] | None = None,
        down: bool = False,
    ) -> None:
        self.fetched, self.broker_ends, self.first = fetched, broker_ends, first
        self._committed_offset = dict(committed or {})
        self.down = down
        self.requests: list[str] = []

    def highwater(self, tp: TP) -> int | None:
        return self.fetched.get(tp)

    async def highwaters(self, *tps: TP) -> Mapping[TP, int]:
        return await self._answer("end", self.broker_ends, tps)

    async def earliest_offsets(self, *tps: TP) -> Mapping[TP, int]:
        return await self._answer("first", self.first, tps)

    async def _answer(
        self, what: str, table: Mapping[TP, int], tps: tuple[TP, ...]
    ) -> Mapping[TP, int]:
        self.requests.append(what)
        if self.down:
            await asyncio.sleep(10)  # the broker does not answer
        return {tp: table[tp] for tp in tps}


def _positions(consumer: FakeConsumer, done: dict[TP, int]) -> dict[TP, Position]:
    reader = ReadPositions(lambda: consumer, timeout_s=0.05)
    for tp, offset in done.items():
        reader.processed(tp, offset)
    return asyncio.run(reader.positions([TOPO, STATE]))


def test_records_fetched_but_not_processed_are_not_read() -> None:
    # A new job's 8 topology records sit in the stream buffer (the consumer's
    # position is past them) while its state batches are being processed.
    consumer = FakeConsumer({TOPO: 8, STATE: 500}, {}, {TOPO: 0, STATE: 0})
    at = _positions(consumer, {STATE: 499})
    assert at == {TOPO: -1, STATE: "end"}
    at = _positions(consumer, {STATE: 499, TOPO: 7})
    assert at == {TOPO: "end", STATE: "end"}


def test_reading_begins_at_the_committed_offset_else_the_first() -> None:
    committed = {TOPO: 8, STATE: 300}
    consumer = FakeConsumer({TOPO: 8, STATE: 500}, {}, {TOPO: 0, STATE: 0}, committed)
    assert _positions(consumer, {}) == {TOPO: "end", STATE: -1}
    trimmed = FakeConsumer({TOPO: 8, STATE: 500}, {}, {TOPO: 8, STATE: 500})
    assert _positions(trimmed, {}) == {TOPO: "end", STATE: "end"}
    assert trimmed.requests == ["first"]


def test_records_retention_deleted_past_the_commit_are_not_waited_for() -> None:
    # Every heartbeat up to offset 500 expired; the group committed 300.
    committed = {STATE: 300}
    consumer = FakeConsumer({TOPO: 8, STATE: 500}, {}, {TOPO: 0, STATE: 500}, committed)
    assert _positions(consumer, {TOPO: 7}) == {TOPO: "end", STATE: "end"}


def test_an_end_no_fetch_reported_is_asked_of_the_broker() -> None:
    consumer = FakeConsumer({STATE: 500}, {TOPO: 8}, {TOPO: 0, STATE: 0})
    assert _positions(consumer, {STATE: 499}) == {TOPO: -1, STATE: "end"}
    assert consumer.requests == ["end", "first"]
    consumer = FakeConsumer({STATE: 500}, {TOPO: 0}, {TOPO: 0, STATE: 0})
    assert _positions(consumer, {STATE: 499}) == {TOPO: "end", STATE: "end"}


def test_a_broker_that_does_not_answer_leaves_the_partition_behind() -> None:
    consumer = FakeConsumer({STATE: 500}, {TOPO: 0}, {TOPO: 0}, down=True)
    reader = ReadPositions(lambda: consumer, timeout_s=0.05)
    reader.processed(STATE, 499)
    for _ in range(3):  # one request, then none for a while
        at = asyncio.run(reader.positions([TOPO, STATE]))
        assert at == {TOPO: -1, STATE: "end"}
    assert consumer.requests == ["end"]


def test_revoked_partitions_are_forgotten() -> None:
    consumer = FakeConsumer({TOPO: 8, STATE: 500}, {}, {TOPO: 0, STATE: 0})
    reader = ReadPositions(lambda: consumer)
    reader.processed(TOPO, 7)
    reader.processed(TP("raw.topology", 2), 3)
    reader.drop({6})
    assert reader.done == {TP("raw.topology", 2): 3}


def test_fausts_consumer_keeps_the_committed_offsets_read_here() -> None:
    # Faust sets it up per consumer and fills it when it seeks to the
    # committed offsets on assignment (a consumer needs a running loop to
    # build, so its source is read instead).
    assert "_committed_offset" in Consumer.__annotations__
    for method in (Consumer.__init__, Consumer.perform_seek):
        assert "self._committed_offset" in inspect.getsource(method)
    assert "_committed_offset" in inspect.getsource(committed_offset)
