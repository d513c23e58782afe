"""Topics of the stream worker: Mycroft's topics plus the internal tick topic."""

from __future__ import annotations

from confluent_kafka.cimpl import NewTopic

from mycroft.kafka_client import create_missing, create_topics
from mycroft.streams.faust_runtime import MAX_MESSAGE_BYTES
from mycroft.streams.faust_settings import StreamSettings
from mycroft.topics import TopicSet


def tick_topic(settings: StreamSettings) -> str:
    """Name of the internal tick topic (one per app id and stage, co-partitioned)."""
    return f"{settings.group_id}-tick"


TABLES: dict[str, str] = {
    "engine-snapshots": "compact",
    "emitted": "compact",
    "rank-chunks": "compact,delete",
    "comm-ops": "compact,delete",
}
"""Tables of the worker and the cleanup policy of their changelog topics."""


def changelog_topic(settings: StreamSettings, table: str) -> str:
    """Name Faust gives the changelog topic of ``table``."""
    return f"{settings.group_id}-{table}-changelog"


def ensure_topics(settings: StreamSettings, timeout_s: float = 30.0) -> list[str]:
    """Create Mycroft's topics, the tick topic and the table changelogs.

    Faust does not create source topics and its tables need the same partition
    count on every co-partitioned topic; it also raced its own creation of the
    windowed tables' changelogs (PartitionsMismatch against a topic of 0
    partitions), so every topic is created here before the worker starts.

    Raises:
        BrokerError: the broker refused a topic.
    """
    topics = TopicSet(settings.prefix, settings.partitions)
    extra = settings.security.librdkafka()
    created = create_topics(
        settings.bootstrap, topics, timeout_s=timeout_s, extra=extra
    )
    new = [
        NewTopic(
            tick_topic(settings),
            num_partitions=settings.partitions,
            replication_factor=1,
            config={"retention.ms": str(3_600_000)},
        )
    ]
    new += [
        NewTopic(
            changelog_topic(settings, table),
            num_partitions=settings.partitions,
            replication_factor=1,
            config={
                "cleanup.policy": policy,
                "max.message.bytes": str(MAX_MESSAGE_BYTES),
            },
        )
        for table, policy in TABLES.items()
    ]
    return created + create_missing(
        settings.bootstrap, new, timeout_s=timeout_s, extra=extra
    )
