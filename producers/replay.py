"""``mycroft replay FILE --bootstrap HOST:PORT``: publish a trace file to Kafka.

Values are sent byte for byte (their dedup keys unchanged), partitioned by
job. ``--speed 1`` keeps the recorded pacing; the default sends at once. For
a durable, resumable replay use ``mycroft agent --source replay``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mycroft.broker_watch import PRODUCING, BrokerWatch
from mycroft.cli_parser import mycroft_parser
from mycroft.config import add_config_flag, add_flags, load, setting
from mycroft.errors import ConfigError
from mycroft.kafka_client import RecordPublisher, create_topics
from mycroft.kafka_security import (
    PLAINTEXT,
    KafkaSecurity,
    env_prefixes,
    security_from,
)
from mycroft.kafka_security import add_flags as add_security_flags
from mycroft.logs import setup_logging
from mycroft.producers.tracefile import read_frames
from mycroft.topics import TopicSet

log = logging.getLogger(__name__)


DESCRIPTION = (
    "Publish a recorded trace file to Kafka, record by record and byte for "
    "byte, partitioned by job: at once, or at the recorded pace with --speed 1. "
    "For a durable, resumable replay use 'mycroft agent --source replay'."
)


@dataclass(frozen=True)
class ReplaySettings:
    """What ``mycroft replay`` needs; built once in :func:`main`."""

    file: Path
    bootstrap: str = setting(
        doc="Kafka bootstrap servers (--kafka: its older name)",
        env=("MYCROFT_BOOTSTRAP", "MYCROFT_REPLAY__KAFKA"),
        metavar="HOST:PORT",
    )
    topic_prefix: str = setting("", "topic name prefix")
    partitions: int = setting(0, "override partition counts (0: per topic)")
    speed: float = setting(0.0, "1.0 = recorded pace; 0 = at once")
    create_topics: bool = setting(False, "create missing topics first")
    kafka_option: tuple[str, ...] = setting(
        (), "librdkafka setting (repeatable)", metavar="KEY=VALUE"
    )
    security: KafkaSecurity = PLAINTEXT

    def __post_init__(self) -> None:
        if self.speed < 0:
            raise ConfigError(f"--speed must be >= 0, not {self.speed}")
        for opt in self.kafka_option:
            if "=" not in opt:
                raise ConfigError(f"--kafka-option {opt!r} needs KEY=VALUE")

    def kafka_config(self) -> dict[str, Any]:
        """The security and ``--kafka-option`` settings as librdkafka's dict
        (an option wins over a security flag)."""
        options = dict(opt.partition("=")[::2] for opt in self.kafka_option)
        return self.security.librdkafka() | options


def _parser() -> argparse.ArgumentParser:
    p = mycroft_parser("replay", DESCRIPTION)
    p.add_argument("file", type=Path, help="trace file (.trace or .trace.gz)")
    add_config_flag(p)
    add_flags(p, ReplaySettings, "replay")
    p.add_argument(
        "--kafka",
        dest="kafka_alias",
        metavar="HOST:PORT",
        default=argparse.SUPPRESS,
        help="deprecated: --bootstrap",
    )
    add_security_flags(p, env_prefixes("replay"))
    return p


def load_settings(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> ReplaySettings:
    """Parse ``argv`` and merge it over the environment and the config file.

    Raises:
        ConfigError: ``--bootstrap`` missing, or a value that does not hold.
    """
    env = os.environ if env is None else env
    flags = vars(_parser().parse_args(list(argv)))
    if "kafka_alias" in flags:
        print("mycroft replay: --kafka is deprecated; use --bootstrap", file=sys.stderr)
        flags.setdefault("bootstrap", flags.pop("kafka_alias"))
    security = security_from(flags, env, env_prefixes("replay"))
    extra = {"file": flags["file"], "security": security}
    return load(ReplaySettings, "replay", flags, env, extra=extra)


def replay(path: Path, publisher: RecordPublisher, speed: float = 0.0) -> int:
    """Publish every frame of ``path``; return how many were queued."""
    t0_trace: int | None = None
    t0 = time.monotonic()
    n = 0
    for frame in read_frames(path):
        if speed > 0:
            t0_trace = frame.ts_ns if t0_trace is None else t0_trace
            wait = (frame.ts_ns - t0_trace) / 1e9 / speed - (time.monotonic() - t0)
            if wait > 0:
                time.sleep(wait)
        topic = publisher.topics.for_record(frame.record_type)
        publisher.publish_bytes(topic, frame.key.split("/")[0], frame.key, frame.value)
        publisher.poll(0)
        n += 1
    return n


def main(argv: Sequence[str] | None = None) -> int:
    """Replay one file; exit 1 if any delivery failed, 2 on bad arguments."""
    settings = load_settings(sys.argv[1:] if argv is None else argv)
    setup_logging()
    return run(settings)


def run(s: ReplaySettings) -> int:
    """Publish ``s.file``; return 0, or 1 if a record was not delivered."""
    extra = s.kafka_config()
    topics = TopicSet(s.topic_prefix, s.partitions or None)
    try:
        if s.create_topics:
            create_topics(s.bootstrap, topics, extra=extra)
        publisher = RecordPublisher(s.bootstrap, topics, extra=extra)
        with BrokerWatch(s.bootstrap, PRODUCING):
            n = replay(s.file, publisher, s.speed)
    except ConfigError as exc:
        print(f"mycroft replay: {exc}", file=sys.stderr)
        return 2
    left = publisher.flush(60.0)
    st = publisher.stats
    if st.refused is not None:
        raise st.refused  # an ACL or the credentials: not worth a retry
    log.info(
        "replayed %d records: %d delivered, %d failed, %d unconfirmed",
        n,
        st.delivered,
        st.failed,
        left,
    )
    return 0 if st.failed == 0 and left == 0 else 1
