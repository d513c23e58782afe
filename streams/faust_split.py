"""Stage 0 of the two-stage worker: raw topics -> ``split.commstate`` per comm group.

Stateless: each state or completion batch is decoded, cut by comm group
(:func:`~mycroft.streams.core.comm_split.split_by_comm`) and every part is
re-encoded to the split topic under the key ``job/comm_group``, partition
``group_partition(job, group, N)``. Every group gets a part of every state
batch, empty or not, which carries the host's liveness; topology records are
copied to every group, and so are heartbeats that carry NIC port state (root
cause reads it; stage 1 takes nothing else from a heartbeat). A heartbeat's
liveness is not used there: merged into one partition with the state
batches, a heartbeat consumed ahead of the state backlog would move a host's
clock past rows not folded yet and fake a stall, and the state parts already
prove the host alive. Offsets
are committed by Faust on its interval after the sends: at-least-once, and a
re-sent part is dropped by stage 1, which dedups batches on their unchanged
headers.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import faust

from mycroft import dead_letters
from mycroft.errors import DecodeError
from mycroft.kafka_client import deadletter_headers
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import CompletionBatch, Heartbeat, StateBatch, Topology
from mycroft.streams.consumer_guards import seek_unsought_to_first
from mycroft.streams.core.comm_split import split_by_comm
from mycroft.streams.faust_runtime import record_job
from mycroft.streams.faust_settings import StreamSettings
from mycroft.topics import TopicSet, group_key, group_partition

log = logging.getLogger(__name__)


class Splitter:
    """Decode -> split by comm group -> encode -> send, for one Faust app."""

    def __init__(self, app: faust.App, settings: StreamSettings, topics: TopicSet):
        self.settings, self.topics = settings, topics
        self.codec = Codec()
        self.counts: Counter[str] = Counter()
        raw: dict[str, Any] = {"value_serializer": "raw", "key_serializer": "raw"}
        self.source = app.topic(
            topics.state, topics.completion, topics.topology, topics.heartbeat, **raw
        )
        self.out = app.topic(topics.split_state, **raw)
        self.deadletter = app.topic(topics.deadletter, **raw)
        self.partitions = topics.partitions("split.commstate")

    async def handle(self, msg: Any) -> None:
        """Split one raw record to the comm groups that need it."""
        try:
            record = self.codec.decode(msg.value)
        except DecodeError as exc:
            err = exc.located(msg.topic, msg.partition, msg.offset)
            self.counts["dead_lettered"] += 1
            log.warning("%s; sent to %s", err, self.topics.deadletter)
            source = f"{err.topic}[{err.partition}]@{err.offset}"
            value, headers = dead_letters.fit(
                msg.value, msg.key, deadletter_headers(err, source)
            )
            await self.deadletter.send(key=msg.key, value=value, headers=headers)
            return
        job = record_job(record)
        groups = self.settings.comm_groups
        if isinstance(record, StateBatch | CompletionBatch):
            for g, part in split_by_comm(record, groups).items():
                if isinstance(part, CompletionBatch) and not len(part.op):
                    continue  # the state batch already proves the host alive
                await self.send(job, g, self.codec.encode(part))
            self.counts["rows"] += (
                len(record.rc) if isinstance(record, StateBatch) else 0
            )
        elif isinstance(record, Topology) or (
            isinstance(record, Heartbeat) and record.nics
        ):
            for g in range(groups):
                await self.send(job, g, msg.value)
        self.counts["records"] += 1

    async def send(self, job: str, group: int, value: bytes) -> None:
        """Send one part keyed and partitioned by ``job/group``."""
        await self.out.send(
            key=group_key(job, group).encode(),
            value=value,
            partition=group_partition(job, group, self.partitions),
        )
        self.counts["parts"] += 1


def build_split_app(settings: StreamSettings, config: dict[str, Any]) -> faust.App:
    """The stage-0 Faust app: one agent, Faust's own periodic offset commits."""
    app = faust.App(
        settings.group_id,
        **(config | {"broker_commit_every": 1000, "broker_commit_interval": 1.0}),
    )
    splitter = Splitter(app, settings, TopicSet(settings.prefix, settings.partitions))
    # Faust's own commits are the ones this stage wants; a new job's first
    # records must still survive a rebalance (``consumer_guards``).
    seek_unsought_to_first(app.consumer, splitter.source.topics, splitter.counts)

    @app.agent(splitter.source, name="mycroft-split")
    async def split(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            try:
                await splitter.handle(msg)
            except Exception:  # one bad record must not restart the agent
                splitter.counts["handle_failed"] += 1
                log.exception("record %s[%d]@%d failed; skipped",
                              msg.topic, msg.partition, msg.offset)  # fmt: skip

    return app
