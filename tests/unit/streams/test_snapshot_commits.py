"""Only a snapshot commits offsets: Faust's own commits are declined."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from typing import Any

from faust.transport.consumer import Consumer
from faust.types import TP

from mycroft.streams.app import snapshot_commits_only


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
