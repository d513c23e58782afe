"""``mycroft topics``: create and list Mycroft's topics through the admin API."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from mycroft.errors import MycroftError
from mycroft.kafka_client import create_topics
from mycroft.kafka_security import add_flags, security_from
from mycroft.topics import TOPICS, TopicSet

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mycroft topics", description=__doc__)
    sub = p.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="create missing topics (idempotent)")
    create.add_argument(
        "--bootstrap",
        default=os.environ.get("MYCROFT_BOOTSTRAP"),
        help="Kafka bootstrap servers (env MYCROFT_BOOTSTRAP)",
    )
    create.add_argument("--prefix", default="", help="namespace prefix for every topic")
    create.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="override every topic's partition count",
    )
    create.add_argument("--replication", type=int, default=1)
    add_flags(create, "MYCROFT_")
    sub.add_parser("list", help="print the declared topics")
    return p


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
    if not args.bootstrap:
        print(
            "mycroft topics create: give --bootstrap HOST:PORT or set MYCROFT_BOOTSTRAP"
        )
        return 2
    topics = TopicSet(args.prefix, args.partitions)
    try:
        extra = security_from(vars(args), os.environ, "MYCROFT_").librdkafka()
        created = create_topics(
            args.bootstrap, topics, replication=args.replication, extra=extra
        )
    except MycroftError as exc:
        print(f"mycroft topics create: {exc}")
        return 1
    for key in topics.specs:
        name = topics.name(key)
        print(f"{name}: {'created' if name in created else 'exists'}")
    return 0
