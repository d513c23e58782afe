"""AwaitedTable: a changelog write is awaited until the broker acknowledges it."""

from __future__ import annotations

import asyncio

import faust
import pytest

from mycroft.streams.faust_tables import awaited_table


def _table() -> faust.Table:
    app = faust.App("test-awaited", broker="kafka://127.0.0.1:1", store="memory://")
    return awaited_table(app, "snapshots", partitions=2, key_type=str)


def test_written_waits_for_every_change_sent_through_the_buffer() -> None:
    async def scenario() -> None:
        table = _table()
        first = table.send_changelog(0, "job-a", b"blob")
        second = table.send_changelog(1, "job-b", None, value_serializer="raw")
        waiter = asyncio.ensure_future(table.written())
        await asyncio.sleep(0.05)
        assert not waiter.done()  # both still in the producer's buffer
        first.set_result(None)
        await asyncio.sleep(0.05)
        assert not waiter.done()  # one acknowledged, one not
        second.set_result(None)
        await asyncio.wait_for(waiter, 1.0)
        assert table.in_flight == []
        await table.written()  # nothing sent since: returns at once

    asyncio.run(scenario())


def test_a_failed_changelog_send_fails_the_wait() -> None:
    async def scenario() -> None:
        table = _table()
        fut = table.send_changelog(0, "job-a", b"blob")
        fut.set_exception(RuntimeError("broker refused the write"))
        with pytest.raises(RuntimeError, match="refused"):
            await table.written()

    asyncio.run(scenario())
