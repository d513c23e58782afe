"""``mycroft topics``: create and list Mycroft's topics through the admin API."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mycroft.cli_parser import mycroft_parser
from mycroft.config import add_config_flag, add_flags, load, setting
from mycroft.errors import MycroftError
from mycroft.kafka_client import create_topics
from mycroft.kafka_diagnosis import refused_exception
from mycroft.kafka_security import (
    PLAINTEXT,
    KafkaSecurity,
    env_prefixes,
    security_from,
)
from mycroft.kafka_security import add_flags as add_security_flags
from mycroft.topics import TOPICS, TopicSet

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Create the Kafka topics Mycroft uses, with their partitions, retention "
    "and compaction (existing topics are left as they are), or list them."
)


@dataclass(frozen=True)
class TopicsSettings:
    """What ``mycroft topics create`` needs."""

    bootstrap: str = setting(
        "",
        "Kafka bootstrap servers",
        env=("MYCROFT_BOOTSTRAP",),
        shown="none",
        metavar="HOST:PORT",
    )
    prefix: str = setting("", "namespace prefix for every topic")
    partitions: int = setting(
        0, "override every topic's partition count", shown="per topic, 0"
    )
    replication: int = setting(1, "replication factor of every topic")
    security: KafkaSecurity = PLAINTEXT


def _parser() -> argparse.ArgumentParser:
    p = mycroft_parser("topics", DESCRIPTION)
    sub = p.add_subparsers(dest="action", required=True)
    create = sub.add_parser(
        "create", help="create missing topics (idempotent)", description=DESCRIPTION
    )
    add_config_flag(create)
    add_flags(create, TopicsSettings, "topics")
    add_security_flags(create, env_prefixes("topics"))
    sub.add_parser(
        "list", help="print the declared topics", description="Print every topic "
        "Mycroft declares: record, key, partitions, retention, cleanup policy.",
    )  # fmt: skip
    return p


def load_settings(flags: Mapping[str, Any], env: Mapping[str, str]) -> TopicsSettings:
    """The settings of ``topics create`` from its parsed flags and ``env``."""
    security = security_from(flags, env, env_prefixes("topics"))
    return load(TopicsSettings, "topics", flags, env, extra={"security": security})


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mycroft topics``."""
    args = _parser().parse_args(argv)
    if args.action == "list":
        for spec in TOPICS:
            policy = "compact" if spec.compacted else "delete"
            print(
                f"{spec.name:<32} {spec.record:<16} key={spec.key:<12} "
                f"partitions={spec.partitions} "
                f"retention_ms={spec.retention_ms} {policy}"
            )
        return 0
    settings = load_settings(vars(args), os.environ)
    if not settings.bootstrap:
        print(
            "mycroft topics create: give --bootstrap HOST:PORT or set MYCROFT_BOOTSTRAP"
        )
        return 2
    return create(settings)


def create(s: TopicsSettings) -> int:
    """Create the missing topics of ``s``; print each one's fate; return 0 or 1."""
    topics = TopicSet(s.prefix, s.partitions or None)
    try:
        created = create_topics(
            s.bootstrap,
            topics,
            replication=s.replication,
            extra=s.security.librdkafka(),
        )
    except MycroftError as exc:
        if exc.__cause__ is not None and refused_exception(exc.__cause__):
            raise  # an ACL: the mycroft command says what to check
        print(f"mycroft topics create: {exc}")
        return 1
    for key in topics.specs:
        name = topics.name(key)
        print(f"{name}: {'created' if name in created else 'exists'}")
    return 0
