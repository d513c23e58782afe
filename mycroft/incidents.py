"""mycroft incidents list|show|follow: the incidents Mycroft found, from Kafka.

Reads the root-cause and anomaly topics (and, for show, the topology
topic) with the project's decoding consumer, under a consumer group of its
own that commits nothing.

* list: open incidents and those revised in the last --since seconds,
  of one job (--job) or all jobs, oldest first.
* show ID: one incident whole (ID, or a unique part of it).
* follow: a live console: each new incident, each revision and each
  anomaly as it arrives (the demo prints through the same code). What was on
  the topics before it started is read silently first (--from-beginning
  prints it too). Ctrl-C stops it.

--json prints JSON instead: one document for list and show, one
JSON object per line for follow. An incident is open while its latest
revision is younger than --ttl seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from mycroft.cli_parser import MycroftParser, mycroft_parser
from mycroft.errors import BrokerError, ConfigError, InputError
from mycroft.incident_book import DEFAULT_TTL_S, IncidentBook
from mycroft.incident_card import card_lines, incident_json, summary_json
from mycroft.incident_console import Console
from mycroft.kafka_client import DecodingConsumer
from mycroft.kafka_security import add_flags as add_security_flags
from mycroft.kafka_security import security_from
from mycroft.stop_signal import Stopper, StopSignal
from mycroft.topics import TopicSet

BOOTSTRAP_HINT = "--bootstrap HOST:PORT or MYCROFT_BOOTSTRAP"


@dataclass(frozen=True)
class Source:
    """Where incidents are read from."""

    bootstrap: str
    topics: TopicSet
    timeout_s: float = 30.0
    extra: dict[str, str] = field(default_factory=dict)  # TLS/SASL settings

    def consumer(self, names: list[str]) -> DecodingConsumer:
        """A consumer of ``names`` from their beginning, in a group of its own."""
        return DecodingConsumer(
            self.bootstrap,
            f"mycroft-incidents-{uuid.uuid4().hex[:12]}",
            names,
            self.topics.deadletter,
            auto_commit=False,
            extra=dict(self.extra),
        )

    def existing(self, names: list[str]) -> list[str]:
        """Those of ``names`` the broker has.

        Raises:
            BrokerError: the broker gave no metadata within ``timeout_s``.
        """
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.extra})
        try:
            meta = admin.list_topics(timeout=min(self.timeout_s, 10.0))
        except KafkaException as exc:
            raise BrokerError(
                f"Kafka at {self.bootstrap} did not answer ({exc.args[0].str()}); "
                f"check {BOOTSTRAP_HINT}"
            ) from exc
        return [n for n in names if n in meta.topics]


def catch_up(
    source: Source, consumer: DecodingConsumer, book: IncidentBook, names: list[str]
) -> None:
    """Poll ``consumer`` into ``book`` until it read every partition to its end.

    Raises:
        BrokerError: that took longer than the source's timeout.
    """
    deadline = time.monotonic() + source.timeout_s
    while not consumer.caught_up():
        if time.monotonic() > deadline:
            raise BrokerError(
                f"Kafka at {source.bootstrap} did not hand out {', '.join(names)} "
                f"within {source.timeout_s:.0f} s; check {BOOTSTRAP_HINT}"
            )
        for _, record in consumer.poll(timeout_s=0.2):
            book.add(record)


def read_book(source: Source, names: list[str]) -> IncidentBook:
    """Everything on the topics ``names`` now, as a book."""
    book = IncidentBook()
    present = source.existing(names)
    if not present:
        return book
    consumer = source.consumer(present)
    try:
        catch_up(source, consumer, book, present)
    finally:
        consumer.close()
    return book


def follow(
    source: Source, console: Console, stop: Stopper, *, from_beginning: bool = False
) -> None:
    """Print what arrives on the topics until ``stop`` is set."""
    names = [source.topics.anomaly, source.topics.rootcause]
    consumer = source.consumer(names)
    try:
        if source.existing(names) == names:
            if from_beginning:
                console.start()
            catch_up(source, consumer, console.book, names)
        console.status(
            f"following incidents on Kafka at {source.bootstrap} "
            f"({source.topics.rootcause}); Ctrl-C to stop"
        )
        console.start()
        while not stop.is_set():
            for _, record in consumer.poll(timeout_s=0.3):
                console.show(record)
    finally:
        consumer.close()


DESCRIPTION = (
    "The incidents Mycroft found, read back from Kafka with a consumer group "
    "that commits nothing: list them, show one whole, or follow them live. An "
    "incident is open while its latest revision is younger than --ttl seconds; "
    "--json prints one document (list, show) or one object per line (follow)."
)


def _parser() -> argparse.ArgumentParser:
    env = os.environ
    common = MycroftParser(add_help=False)
    add = common.add_argument
    add(
        "--bootstrap",
        metavar="HOST:PORT",
        default=env.get("MYCROFT_BOOTSTRAP"),
        help="Kafka bootstrap servers (env MYCROFT_BOOTSTRAP)",
    )
    add(
        "--topic-prefix",
        metavar="PREFIX",
        default=env.get("MYCROFT_TOPIC_PREFIX", ""),
        help="namespace prefix of the topics (env MYCROFT_TOPIC_PREFIX)",
    )
    add("--job", metavar="JOB", help="only this job's incidents (default: every job)")
    add(
        "--ttl",
        type=float,
        metavar="SECONDS",
        default=DEFAULT_TTL_S,
        help="seconds without a revision before an incident counts as closed "
        "(default 600)",
    )
    add(
        "--timeout",
        type=float,
        metavar="SECONDS",
        default=30.0,
        help="seconds to wait for Kafka to hand out the topics (default 30)",
    )
    add("--json", action="store_true", help="machine-readable output")
    add_security_flags(common, "MYCROFT_")
    p = mycroft_parser("incidents", DESCRIPTION)
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser(
        "list",
        parents=[common],
        help="open and recent incidents",
        description="List the open incidents and those revised in the last "
        "--since seconds, oldest first.",
    )
    ls.add_argument(
        "--since",
        type=float,
        metavar="SECONDS",
        default=86_400.0,
        help="also list incidents revised in the last SECONDS (default 86400)",
    )
    ls.add_argument("--open", action="store_true", help="only open incidents")
    show = sub.add_parser(
        "show",
        parents=[common],
        help="one incident whole",
        description="Print one incident whole: culprit and where it sits, "
        "component, fault, confidence, evidence, latencies, anomalies, revisions.",
    )
    show.add_argument("incident", metavar="ID", help="incident id, or a unique part")
    show.add_argument(
        "--report",
        metavar="DIR",
        help="also write DIR/index.html with figures, from the job's raw records "
        "still on the raw topics (the 'report' extra: matplotlib)",
    )
    fol = sub.add_parser(
        "follow",
        parents=[common],
        help="print incidents live",
        description="Print each new incident, each revision and each anomaly as "
        "it arrives, after reading what is already on the topics silently; "
        "Ctrl-C stops it.",
    )
    fol.add_argument(
        "--from-beginning",
        action="store_true",
        help="print what is already on the topics first",
    )
    fol.add_argument(
        "--no-anomalies", action="store_true", help="print root causes only"
    )
    return p


def _list(source: Source, args: argparse.Namespace, out: IO[str]) -> int:
    book = read_book(source, [source.topics.anomaly, source.topics.rootcause])
    now = time.time_ns()
    found = book.select(
        job_id=args.job, now_ns=now, since_s=args.since, open_only=args.open,
        ttl_s=args.ttl,
    )  # fmt: skip
    if args.json:
        rows = [summary_json(i, now, args.ttl) for i in found]
        print(json.dumps({"incidents": rows}, indent=2), file=out)
        return 0
    if not found:
        print("no incidents", file=out)
    for inc in found:
        row = summary_json(inc, now, args.ttl)
        print(
            f"{row['detected_at']}  {row['status']:<6}  {row['kind']:<9} "
            f"{row['subject'] or 'no culprit'}: {row['component'] or '-'} "
            f"({row['confidence'] or 0:.2f}), rev {row['revision']}  "
            f"{row['incident_id']}",
            file=out,
        )
    return 0


def _show(source: Source, args: argparse.Namespace, out: IO[str]) -> int:
    if args.report:
        from mycroft.report import require_matplotlib  # noqa: PLC0415

        require_matplotlib()
    topics = source.topics
    book = read_book(source, [topics.anomaly, topics.rootcause, topics.topology])
    found = [
        i for i in book.find(args.incident)
        if args.job is None or i.latest.job_id == args.job
    ]  # fmt: skip
    if len(found) != 1:
        what = "no incident" if not found else f"{len(found)} incidents"
        raise InputError(
            f"{what} on {topics.rootcause} match {args.incident!r}; "
            "see their ids with 'mycroft incidents list'"
        )
    now = time.time_ns()
    if args.json:
        print(json.dumps(incident_json(book, found[0], now, args.ttl), indent=2),
              file=out)  # fmt: skip
    else:
        print("\n".join(card_lines(book, found[0], now, args.ttl)), file=out)
    if args.report:
        from mycroft.report.from_topics import write_from_topics  # noqa: PLC0415

        page = write_from_topics(source, book, found[0], args.report)
        print(f"report: {page}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Run one ``mycroft incidents`` action; return its exit code."""
    out = out or sys.stdout
    if not args.bootstrap:
        raise ConfigError(f"no Kafka to read incidents from: give {BOOTSTRAP_HINT}")
    security = security_from(vars(args), os.environ, "MYCROFT_")
    source = Source(
        args.bootstrap, TopicSet(args.topic_prefix), args.timeout, security.librdkafka()
    )
    if args.action == "list":
        return _list(source, args, out)
    if args.action == "show":
        return _show(source, args, out)
    stop = StopSignal()
    stop.install()
    console = Console(out, as_json=args.json, job_id=args.job,
                      anomalies=not args.no_anomalies)  # fmt: skip
    try:
        follow(source, console, stop, from_beginning=args.from_beginning)
    finally:
        stop.restore()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mycroft incidents``."""
    return run(_parser().parse_args(argv))
