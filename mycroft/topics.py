"""Every Kafka topic Mycroft uses, declared in one place.

Names follow ``mycroft.<stage>.<entity>.v<N>``; ``N`` changes only on an
incompatible schema change (see ``schemas/README.md``). All topics are
partitioned by job id (:func:`partition_for`), so one job's records stay in
order on one partition and one stream worker owns a job; the two-stage
worker's internal ``split.commstate`` topic is keyed ``job_id/comm_group``
and partitioned by :func:`group_partition` (``streams/SCALING.md``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its name, what it carries and how Kafka keeps it."""

    stage: str
    entity: str
    version: int
    record: str
    key: str
    partitions: int
    retention_ms: int
    compacted: bool = False
    doc: str = ""

    @property
    def name(self) -> str:
        """The topic name without a namespace prefix."""
        return f"mycroft.{self.stage}.{self.entity}.v{self.version}"

    def config(self) -> dict[str, str]:
        """Broker-side topic configuration."""
        cfg = {"retention.ms": str(self.retention_ms)}
        if self.compacted:
            cfg |= {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}
        return cfg


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(
        "raw",
        "topology",
        1,
        "Topology",
        "job_id/host",
        8,
        7 * DAY_MS,
        True,
        "communicator topology per host; compacted, latest per host kept",
    ),
    TopicSpec(
        "raw",
        "state",
        1,
        "StateBatch",
        "job_id",
        8,
        DAY_MS,
        False,
        "in-flight collective state per host per sampling tick",
    ),
    TopicSpec(
        "raw",
        "completion",
        1,
        "CompletionBatch",
        "job_id",
        8,
        DAY_MS,
        False,
        "completed collectives per host per tick",
    ),
    TopicSpec(
        "raw",
        "heartbeat",
        1,
        "Heartbeat",
        "job_id",
        8,
        DAY_MS,
        False,
        "node agent liveness and loss counters",
    ),
    TopicSpec(
        "detect",
        "anomaly",
        1,
        "Anomaly",
        "job_id",
        8,
        7 * DAY_MS,
        False,
        "detected hangs, slowdowns and mismatches",
    ),
    TopicSpec(
        "rca",
        "rootcause",
        1,
        "RootCause",
        "job_id",
        8,
        30 * DAY_MS,
        False,
        "root causes: ranked culprits with evidence, revised per incident",
    ),
    TopicSpec(
        "split",
        "commstate",
        1,
        "-",
        "job_id/comm_group",
        8,
        DAY_MS,
        False,
        "two-stage worker, internal: state/completion rows re-batched per comm "
        "group, heartbeats and topology copied to every group (stage 0 -> 1)",
    ),
    TopicSpec(
        "detect",
        "commsummary",
        1,
        "CommSummary",
        "job_id",
        8,
        DAY_MS,
        False,
        "two-stage worker, internal: per comm group summaries (stage 1 -> 2)",
    ),
    TopicSpec(
        "dlq",
        "raw",
        1,
        "-",
        "source key",
        1,
        7 * DAY_MS,
        False,
        "undecodable records: original bytes, reason in headers",
    ),
)


class TopicSet:
    """Resolved topic names, optionally under a namespace prefix (tests, tenants)."""

    def __init__(self, prefix: str = "", partitions: int | None = None) -> None:
        self.prefix = prefix
        self._partitions = partitions
        self.specs = {f"{s.stage}.{s.entity}": s for s in TOPICS}

    def name(self, key: str) -> str:
        """Full name of topic ``key`` (``"raw.state"``, ``"rca.rootcause"``, ...)."""
        return self.prefix + self.specs[key].name

    def partitions(self, key: str) -> int:
        """Partition count of topic ``key`` (overridden for every topic if set)."""
        return self._partitions or self.specs[key].partitions

    @property
    def topology(self) -> str:
        return self.name("raw.topology")

    @property
    def state(self) -> str:
        return self.name("raw.state")

    @property
    def completion(self) -> str:
        return self.name("raw.completion")

    @property
    def heartbeat(self) -> str:
        return self.name("raw.heartbeat")

    @property
    def anomaly(self) -> str:
        return self.name("detect.anomaly")

    @property
    def rootcause(self) -> str:
        return self.name("rca.rootcause")

    @property
    def split_state(self) -> str:
        return self.name("split.commstate")

    @property
    def comm_summary(self) -> str:
        return self.name("detect.commsummary")

    @property
    def deadletter(self) -> str:
        return self.name("dlq.raw")

    def for_record(self, record_type: str) -> str:
        """The topic that carries records of ``record_type``."""
        for key, spec in self.specs.items():
            if spec.record == record_type:
                return self.name(key)
        raise KeyError(f"no topic carries {record_type!r}")


def partition_for(job_id: str, partitions: int) -> int:
    """Partition of a job: CRC-32 of the UTF-8 job id modulo the partition count.

    Every producer uses this explicitly, so the key may carry more than the job
    id (the compacted topology topic keys by ``job_id/host``).
    """
    return zlib.crc32(job_id.encode("utf-8")) % partitions


def group_partition(job_id: str, group: int, partitions: int) -> int:
    """Partition of one comm group of a job (two-stage worker's split topic).

    The job's partition plus the group, modulo the count: a job's groups land
    on consecutive partitions, so ``G`` groups spread over ``min(G, N)``
    partitions. (CRC-32 of ``job/group`` does not spread them: its low bits
    hardly depend on the last character, e.g. groups 0-3 all share one of 2.)
    """
    return (partition_for(job_id, partitions) + group) % partitions


def group_key(job_id: str, group: int) -> str:
    """Kafka key of one comm group of a job on the split topic: ``job/group``."""
    return f"{job_id}/{group}"


def parse_group_key(key: str) -> tuple[str, int]:
    """Split a ``job/group`` key into ``(job, group)``.

    Raises:
        ValueError: the key has no ``/<int>`` suffix.
    """
    job, sep, group = key.rpartition("/")
    if not sep or not job or not group.isdigit():
        raise ValueError(f"comm-group key {key!r} is not 'job/group'")
    return job, int(group)
