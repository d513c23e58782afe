"""Two changes to Faust's consumer that keep a restarted worker's reading exact.

They are installed on the consumer when the app is built, before its first
rebalance:

- :func:`snapshot_commits_only`: offsets are committed only with a snapshot
  (the worker: :func:`install_guards`).
- :func:`seek_unsought_to_first`: a partition that has no committed offset
  (or offset 0) is read again from its first record after every rebalance
  (the worker, and the split stage, which keeps Faust's own commits).

Both patch one instance's methods, not Faust's classes, and the tests in
``tests/unit/streams/test_consumer_guards.py`` read the Faust and aiokafka
source they rely on, so an upgrade that changes it fails there first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any


def install_guards(
    consumer: Any, sources: Collection[str], counts: Counter[str]
) -> None:
    """Install both guards on ``consumer`` (idempotent); ``sources``: the
    topics whose records must not be lost (the raw topics, not the ticks)."""
    snapshot_commits_only(consumer, counts)
    seek_unsought_to_first(consumer, sources, counts)


def snapshot_commits_only(consumer: Any, counts: Counter[str]) -> None:
    """Make ``consumer`` commit only the offsets ``Pipeline.snapshot`` asks
    for; idempotent.

    Faust commits every acked offset on its own when it stops gracefully
    (SIGTERM, a rolling deploy), when a task fails, and on its commit timer
    (set to never). An acked record is one processed, not one a snapshot
    holds: such a commit lets the next owner of the partition restore the
    last snapshot and resume after records that snapshot never saw. Those
    commits name no topics; ``Pipeline.snapshot``'s always do.
    """
    if getattr(consumer, "_snapshot_commits_only", False):
        return
    faust_commit = consumer.commit

    async def commit(topics: Any = None, start_new_transaction: bool = True) -> bool:
        if topics is None:
            counts["commits_declined"] += 1
            return False
        done: bool = await faust_commit(topics, start_new_transaction)
        return done

    consumer.commit = commit
    consumer._snapshot_commits_only = True  # noqa: SLF001 - marks the wrapper


def seek_unsought_to_first(
    consumer: Any, sources: Collection[str], counts: Counter[str]
) -> None:
    """After Faust's seek to the committed offsets, move the fetch position
    of every ``sources`` partition it did not move to the partition's first
    offset; idempotent.

    While a rebalance is under way (a worker starting, another joining or
    leaving) Faust's fetcher goes on fetching the partitions it has resumed
    and drops what it fetched, as its flow is stopped; the seek to the
    committed offsets that follows is what brings those records back. But
    aiokafka's ``seek_to_committed`` moves only partitions whose committed
    offset is above 0: in a partition with none (a new group, or a job's
    first records on a partition nobody committed yet), the records fetched
    then were lost, and a new job lost the topology records of some hosts,
    whose rows were all then rejected as undeclared ranks (``SCALING.md``).

    "No committed offset" means the first offset, what
    ``consumer_auto_offset_reset = earliest`` starts a new group at:
    records a worker read from there before are read again and skipped by
    the job's own dedup (``JobSlot.taken``).
    """
    if getattr(consumer, "_seek_unsought_to_first", False):
        return
    faust_seek = consumer.seek_to_committed
    topics = frozenset(sources)

    async def seek_to_committed() -> Mapping[Any, int | None]:
        committed: Mapping[Any, int | None] = await faust_seek()
        unsought = [
            tp for tp, off in committed.items() if tp.topic in topics and not off
        ]
        if unsought:
            first = await consumer.earliest_offsets(*unsought)
            for tp in unsought:
                await consumer.seek(tp, first[tp])
            counts["seeks_to_first"] += len(unsought)
        return committed

    consumer.seek_to_committed = seek_to_committed
    consumer._seek_unsought_to_first = True  # noqa: SLF001 - marks the wrapper
