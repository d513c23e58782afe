"""mycroft incidents list|show|follow: the incidents Mycroft found, from Kafka.

Reads the root-cause and anomaly topics (and, for show, the topology
topic) whole, partitions assigned directly (:mod:`mycroft.topic_reader`): no
consumer group to join, nothing committed, an answer in well under 2 s.

* list: open incidents and those revised in the last --since seconds,
  of one job (--job) or all jobs, oldest first.
* show ID: one incident whole (ID, or a unique part of it).
* follow: a live console: each new incident, each revision and each
  anomaly as it arrives (the demo prints through the same code). What was on
  the topics before it started is read silently first (--from-beginning
  prints it too). Ctrl-C stops it.

A reader whose output goes away (``mycroft incidents list | head -1``) stops
quietly, as any Unix filter does.

--json prints JSON instead: one document for list and show, one
JSON object per line for follow. An incident is open until its closed
revision arrives (the worker sends one once nothing fired for
``incident_quiet_s`` of event time); list, show and follow say when it
closed and why (JSON: ``state``, ``closed_at_s``, ``closed_at``,
``close_reason``; follow's ``event`` is ``closed``). Incidents of writers
from before RootCause.4, which never send one, are open while their latest
revision is younger than --ttl seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from confluent_kafka import KafkaException

from mycroft.broker_watch import BrokerWatch
from mycroft.cli_errors import ExitCode
from mycroft.cli_parser import MycroftParser, mycroft_parser
from mycroft.config import (
    add_config_flag,
    add_flags,
    config_path,
    load,
    read_section,
    setting,
)
from mycroft.errors import BrokerError, ConfigError, InputError
from mycroft.incident_book import DEFAULT_TTL_S, IncidentBook
from mycroft.incident_card import card_lines, incident_json, summary_json
from mycroft.incident_console import Console
from mycroft.kafka_security import (
    PLAINTEXT,
    KafkaSecurity,
    env_prefixes,
    security_from,
    split_security,
)
from mycroft.kafka_security import add_flags as add_security_flags
from mycroft.schemas.records import Record
from mycroft.stop_signal import Stopper, StopSignal
from mycroft.topic_reader import TopicReader
from mycroft.topics import TopicSet

BOOTSTRAP_HINT = "--bootstrap HOST:PORT or MYCROFT_BOOTSTRAP"


@dataclass(frozen=True)
class Source:
    """Where incidents are read from."""

    bootstrap: str
    topics: TopicSet
    timeout_s: float = 30.0
    extra: dict[str, str] = field(default_factory=dict)  # TLS/SASL settings
    group_prefix: str = "mycroft-incidents"

    def reader(self, names: list[str]) -> TopicReader:
        """A reader of ``names`` from their beginning, with no consumer group.

        Read-only: a reader never dead-letters (the worker and the sinks did,
        once), so a subscriber credential that may only read the root-cause
        topic can run it.

        Raises:
            KafkaRefused: the broker refused the client (credentials, ACLs).
            BrokerError: the broker gave no metadata within ``timeout_s``.
        """
        try:
            return TopicReader(
                self.bootstrap, names, extra=dict(self.extra),
                timeout_s=min(self.timeout_s, 10.0), group_prefix=self.group_prefix,
            )  # fmt: skip
        except KafkaException as exc:
            raise BrokerError(
                f"Kafka at {self.bootstrap} did not answer ({exc.args[0].str()}); "
                f"check {BOOTSTRAP_HINT}"
            ) from exc


def catch_up(
    source: Source, reader: TopicReader, take: Callable[[Record], object]
) -> None:
    """Poll ``reader`` into ``take`` until it read every partition to the end
    it had when the reader started.

    Raises:
        BrokerError: that took longer than the source's timeout.
    """
    deadline = time.monotonic() + source.timeout_s
    while not reader.caught_up():
        if time.monotonic() > deadline:
            raise BrokerError(
                f"Kafka at {source.bootstrap} did not hand out "
                f"{', '.join(reader.topics)} within {source.timeout_s:.0f} s; "
                f"check {BOOTSTRAP_HINT}"
            )
        for _, record in reader.poll(timeout_s=0.2, max_records=2000):
            take(record)


def read_book(source: Source, names: list[str]) -> IncidentBook:
    """Everything on the topics ``names`` now, as a book."""
    book = IncidentBook()
    reader = source.reader(names)
    try:
        catch_up(source, reader, book.add)
    finally:
        reader.close()
    return book


def follow(
    source: Source, console: Console, stop: Stopper, *, from_beginning: bool = False
) -> None:
    """Print what arrives on the topics until ``stop`` is set; with
    ``from_beginning``, print what is on them already first."""
    topics = source.topics
    reader = source.reader([topics.anomaly, topics.rootcause, topics.topology])
    try:
        if from_beginning:
            console.start()
        catch_up(source, reader, console.show)
        console.status(
            f"following incidents on Kafka at {source.bootstrap} "
            f"({source.topics.rootcause}); Ctrl-C to stop"
        )
        console.start()
        with BrokerWatch(source.bootstrap, "following resumes once it answers"):
            looked = time.monotonic()
            while not stop.is_set():
                for _, record in reader.poll(timeout_s=0.3):
                    console.show(record)
                if reader.missing and time.monotonic() - looked > 1.0:
                    looked = time.monotonic()  # topics created after the start
                    reader.take_new_topics()
    finally:
        reader.close()


DESCRIPTION = (
    "The incidents Mycroft found, read back from Kafka with a consumer group "
    "that commits nothing: list them, show one whole, or follow them live. An "
    "incident is open until its closed revision arrives (older writers: while "
    "its latest revision is younger than --ttl seconds); "
    "--json prints one document (list, show) or one object per line (follow)."
)


@dataclass(frozen=True)
class IncidentsSettings:
    """What every ``mycroft incidents`` action needs: where to read from.

    A setting of :mod:`mycroft.config` (section ``incidents``): a flag,
    ``MYCROFT_INCIDENTS__<FIELD>`` or the older names shown, a key of the
    ``[incidents]`` table of the config file. The security keys of
    :data:`mycroft.kafka_security.KEYS` may sit in that table too.
    """

    bootstrap: str = setting(
        "",
        "Kafka bootstrap servers",
        env=("MYCROFT_BOOTSTRAP",),
        shown="none",
        metavar="HOST:PORT",
    )
    topic_prefix: str = setting(
        "",
        "namespace prefix of the topics",
        env=("MYCROFT_TOPIC_PREFIX",),
        metavar="PREFIX",
    )
    job: str = setting(
        "", "only this job's incidents", shown="every job", metavar="JOB"
    )
    ttl: float = setting(
        DEFAULT_TTL_S,
        "seconds without a revision before an incident of a writer that never "
        "sends a closed revision (RootCause.1-3) counts as closed",
        shown=f"{DEFAULT_TTL_S:g}",
        metavar="SECONDS",
    )
    timeout: float = setting(
        30.0,
        "seconds to wait for Kafka to hand out the topics",
        shown="30",
        metavar="SECONDS",
    )
    group_prefix: str = setting(
        "mycroft-incidents",
        "consumer groups are PREFIX-<random>: a subscriber credential may "
        "use only the group prefix its ACL grants",
        metavar="PREFIX",
    )
    security: KafkaSecurity = PLAINTEXT

    def __post_init__(self) -> None:
        for name in ("ttl", "timeout"):
            value = getattr(self, name)
            if value <= 0:
                raise ConfigError(
                    f"{name} must be > 0 seconds, not {value:g}: give --{name} "
                    f"SECONDS or set MYCROFT_INCIDENTS__{name.upper()}"
                )

    @property
    def job_id(self) -> str | None:
        """The job to keep, None for every job."""
        return self.job or None

    def source(self) -> Source:
        """Where these settings read incidents from."""
        return Source(
            self.bootstrap,
            TopicSet(self.topic_prefix),
            self.timeout,
            self.security.librdkafka(),
            self.group_prefix,
        )


@dataclass(frozen=True)
class Request:
    """One run's action and the flags of that action alone (never in a file:
    they change from one run to the next)."""

    action: str
    as_json: bool = False
    since_s: float = 86_400.0
    open_only: bool = False
    incident: str = ""
    report: str = ""
    from_beginning: bool = False
    anomalies: bool = True
    verbose: bool = False


def load_settings(
    flags: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> IncidentsSettings:
    """The settings from parsed ``flags`` (``vars(namespace)``), ``env`` and
    the ``[incidents]`` table of the config file.

    Raises:
        ConfigError: the file cannot be read, an unknown key, or a bad value.
    """
    env = os.environ if env is None else env
    path = config_path(flags, env)
    file_security, file_values = split_security(
        read_section(path, "incidents") if path else {}
    )
    security = security_from(flags, env, env_prefixes("incidents"), file_security)
    return load(
        IncidentsSettings,
        "incidents",
        flags,
        env,
        file_values=file_values,
        file_name=f"{path} [incidents]" if path else "",
        extra={"security": security},
    )


DESCRIPTION = (
    "The incidents Mycroft found, read back from Kafka with a consumer group "
    "that commits nothing: list them, show one whole, or follow them live. An "
    "incident is open until its closed revision arrives (older writers: while "
    "its latest revision is younger than --ttl seconds); "
    "--json prints one document (list, show) or one object per line (follow). "
    "Settings: flag, then environment (the variables shown), then the "
    "[incidents] table of --config, then the default."
)


def _parser() -> argparse.ArgumentParser:
    common = MycroftParser(add_help=False)
    add_config_flag(common)
    add_flags(common, IncidentsSettings, "incidents")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    add_security_flags(common, env_prefixes("incidents"))
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
        "--verbose", action="store_true", help="every anomaly (default: the first 3)"
    )
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


def _list(s: IncidentsSettings, req: Request, out: IO[str]) -> int:
    source = s.source()
    book = read_book(source, [source.topics.anomaly, source.topics.rootcause])
    now = time.time_ns()
    found = book.select(
        job_id=s.job_id, now_ns=now, since_s=req.since_s, open_only=req.open_only,
        ttl_s=s.ttl,
    )  # fmt: skip
    if req.as_json:
        rows = [summary_json(i, now, s.ttl) for i in found]
        print(json.dumps({"incidents": rows}, indent=2), file=out)
        return 0
    if not found:
        print("no incidents", file=out)
    for inc in found:
        row = summary_json(inc, now, s.ttl)
        print(
            f"{row['detected_at']}  {row['status']:<6}  {row['kind']:<9} "
            f"{row['subject'] or 'no culprit'}: {row['component'] or '-'} "
            f"({row['confidence'] or 0:.2f}), rev {row['revision']}  "
            f"{row['incident_id']}{_closed_note(row)}",
            file=out,
        )
    return 0


def _closed_note(row: Mapping[str, Any]) -> str:
    """``  closed 2026-...Z: quiet for 5.1 s of event time (...)`` for a row
    whose closed revision arrived; empty otherwise."""
    if row["closed_at"] is None:
        return ""
    return f"  closed {row['closed_at']}: {row['close_reason'] or 'no reason given'}"


def _show(s: IncidentsSettings, req: Request, out: IO[str]) -> int:
    if req.report:
        from mycroft.report import require_matplotlib  # noqa: PLC0415

        require_matplotlib()
    source = s.source()
    topics = source.topics
    book = read_book(source, [topics.anomaly, topics.rootcause, topics.topology])
    found = [
        i for i in book.find(req.incident)
        if s.job_id is None or i.latest.job_id == s.job_id
    ]  # fmt: skip
    if len(found) != 1:
        what = "no incident" if not found else f"{len(found)} incidents"
        raise InputError(
            f"{what} on {topics.rootcause} match {req.incident!r}; "
            "see their ids with 'mycroft incidents list'"
        )
    now = time.time_ns()
    if req.as_json:
        print(json.dumps(incident_json(book, found[0], now, s.ttl), indent=2),
              file=out)  # fmt: skip
    else:
        lines = card_lines(book, found[0], now, s.ttl, verbose=req.verbose)
        print("\n".join(lines), file=out)
    if req.report:
        from mycroft.report.from_topics import write_from_topics  # noqa: PLC0415

        page = write_from_topics(source, book, found[0], req.report)
        print(f"report: {page}", file=sys.stderr)
    return 0


def run(s: IncidentsSettings, req: Request, out: IO[str] | None = None) -> int:
    """Run one ``mycroft incidents`` action; return its exit code.

    Raises:
        ConfigError: no bootstrap servers were given.
    """
    out = out or sys.stdout
    if not s.bootstrap:
        raise ConfigError(
            f"no Kafka to read incidents from: give {BOOTSTRAP_HINT} "
            "(or bootstrap in the [incidents] table of --config)"
        )
    if req.action == "list":
        return _list(s, req, out)
    if req.action == "show":
        return _show(s, req, out)
    stop = StopSignal()
    stop.install()
    console = Console(out, as_json=req.as_json, job_id=s.job_id,
                      anomalies=req.anomalies)  # fmt: skip
    try:
        follow(s.source(), console, stop, from_beginning=req.from_beginning)
    finally:
        stop.restore()
    return int(ExitCode.INTERRUPTED) if stop.signum == signal.SIGINT else 0


def _request(args: argparse.Namespace) -> Request:
    """The action's own flags of the parsed command line."""
    return Request(
        action=args.action,
        as_json=args.json,
        since_s=getattr(args, "since", 86_400.0),
        open_only=getattr(args, "open", False),
        incident=getattr(args, "incident", ""),
        report=getattr(args, "report", None) or "",
        from_beginning=getattr(args, "from_beginning", False),
        anomalies=not getattr(args, "no_anomalies", False),
        verbose=getattr(args, "verbose", False),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mycroft incidents``."""
    args = _parser().parse_args(argv)
    return run(load_settings(vars(args)), _request(args))
