"""``mycroft sinks``: forward detection results from Kafka to the sinks.

Consumes the anomaly, root-cause and heartbeat topics with a
:class:`~mycroft.kafka_client.DecodingConsumer` (bad records go to the dead
letters), writes every record to each configured sink, flushes, and only then
commits the offsets: at-least-once. Sinks are idempotent (anomaly ids,
incident ids with revisions), so re-delivery after a crash is harmless.
Heartbeats only tell sinks that track jobs (:class:`JobWatcher`, the
Prometheus sink) that the job still runs: one silent for ``--job-end``
seconds has ended and its incidents close. Settings: :class:`SinksSettings`
(:mod:`mycroft.config`).

A retryable :class:`~mycroft.errors.SinkError` is retried with exponential
backoff; when retries run out the service exits non-zero *without*
committing, so the batch is consumed again after a restart. A non-retryable
one is logged, counted and dropped. SIGTERM and SIGINT stop it after the
current batch.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import KafkaException

from mycroft.broker_watch import BrokerWatch
from mycroft.cli_errors import ExitCode
from mycroft.cli_parser import mycroft_parser
from mycroft.config import add_config_flag, add_flags, load, setting
from mycroft.errors import ConfigError, KafkaRefused, MycroftError, SinkError
from mycroft.kafka_security import (
    PLAINTEXT,
    KafkaSecurity,
    env_prefixes,
    security_from,
)
from mycroft.kafka_security import add_flags as add_security_flags
from mycroft.logs import setup_logging
from mycroft.schemas.records import Anomaly, Heartbeat, RootCause
from mycroft.sinks.base import JobWatcher, Sink, SinkRecord
from mycroft.stop_signal import StopSignal

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from mycroft.sinks.lag import LagMonitor
    from mycroft.topics import TopicSet

logger = logging.getLogger(__name__)


class RecordSource(Protocol):
    """What the service reads from: a :class:`DecodingConsumer` (or a fake)."""

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Backoff:
    """Retry policy of retryable sink errors (seconds)."""

    first_s: float = 0.2
    max_s: float = 10.0
    attempts: int = 8

    def delays(self) -> list[float]:
        """Sleep before each retry: ``first_s`` doubling up to ``max_s``."""
        return [min(self.max_s, self.first_s * 2**i) for i in range(self.attempts - 1)]


@dataclass
class ForwarderStats:
    """What the forwarder did, for logs and tests."""

    written: int = 0
    skipped: int = 0
    heartbeats: int = 0
    dropped: int = 0
    retries: int = 0
    commits: int = 0
    commit_failures: int = 0
    by_sink: dict[str, int] = field(default_factory=dict)


class Forwarder:
    """The loop: poll, write to every sink, flush, commit.

    Args:
        source: where decoded records come from; ``poll`` returns
            ``(message, record)`` pairs.
        sinks: destinations; each gets every anomaly and root cause.
        commit: called after a batch is flushed to every sink.
        backoff: retry policy of retryable sink errors.
        sleep: waits between retries; tests inject a fake.
    """

    def __init__(
        self,
        source: RecordSource,
        sinks: Sequence[Sink],
        commit: Callable[[], None],
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], bool] | None = None,
        stopping: StopSignal | None = None,
    ) -> None:
        self.source = source
        self.sinks = list(sinks)
        self.stats = ForwarderStats()
        self.stopping = stopping or StopSignal()  # SIGTERM sets it: no lock
        self._commit = commit
        self._backoff = backoff or Backoff()
        self._sleep = sleep or self.stopping.wait

    def run(self, poll_s: float = 0.5) -> None:
        """Forward until :attr:`stopping` is set.

        Raises:
            SinkError: retryable, when retries ran out (nothing committed).
        """
        while not self.stopping.is_set():
            self.step(poll_s)

    def step(self, poll_s: float = 0.5) -> int:
        """Forward one polled batch; return how many records it held."""
        batch = self.source.poll(timeout_s=poll_s)
        for _, record in batch:
            if isinstance(record, Anomaly | RootCause):
                self._deliver(record)
            elif isinstance(record, Heartbeat):
                self._alive(record.job_id)
            else:
                self.stats.skipped += 1
        for sink in self.sinks:
            self._retry(sink, sink.flush, "flush")
        if batch:
            try:
                self._commit()
            except KafkaException as exc:  # Kafka went away mid-run: keep going
                self.stats.commit_failures += 1
                logger.warning(
                    "commit failed (%s): the next batch commits these records "
                    "too; until then a restart forwards them again", exc,
                )  # fmt: skip
                return len(batch)
            self.stats.commits += 1
            s = self.stats
            logger.info("committed %d records (total %d)", len(batch),
                        s.written + s.skipped + s.heartbeats)  # fmt: skip
        return len(batch)

    def _alive(self, job_id: str) -> None:
        self.stats.heartbeats += 1
        for sink in self.sinks:
            if isinstance(sink, JobWatcher):
                sink.job_alive(job_id)

    def _deliver(self, record: SinkRecord) -> None:
        for sink in self.sinks:
            if self._retry(sink, functools.partial(sink.write, record), "write"):
                name = type(sink).__name__
                self.stats.by_sink[name] = self.stats.by_sink.get(name, 0) + 1
        self.stats.written += 1

    def _retry(self, sink: Sink, call: Callable[[], None], what: str) -> bool:
        """Run ``call``; retry retryable errors; return False if dropped."""
        delays = self._backoff.delays()
        for attempt in range(len(delays) + 1):
            try:
                call()
                return True
            except SinkError as exc:
                name = type(sink).__name__
                if not exc.retryable:
                    logger.exception("%s %s failed; dropping", name, what)
                    self.stats.dropped += 1
                    return False
                if attempt == len(delays):
                    raise
                logger.warning("%s %s failed (%s); retry in %.1f s",
                               name, what, exc, delays[attempt])  # fmt: skip
                self.stats.retries += 1
                self._sleep(delays[attempt])
        return False  # pragma: no cover (the loop returns or raises)


DESCRIPTION = """\
Forward the anomalies and root causes on Kafka to Prometheus (/metrics for
Grafana and alerting rules) and/or OpenSearch/Elasticsearch, committing only
what every sink took: a sink that stays down stops the service uncommitted,
and a restart resumes where it left off. Settings: flag, then environment
(the variables shown), then the [sinks] table of --config, then the
default."""


@dataclass(frozen=True)
class SinksSettings:
    """Everything ``mycroft sinks`` needs; built once in :func:`main`."""

    bootstrap: str = setting(
        "",
        "Kafka bootstrap servers",
        env=("MYCROFT_BOOTSTRAP",),
        shown="none",
        metavar="HOST:PORT",
    )
    topic_prefix: str = setting(
        "", "namespace prefix of the topics", env=("MYCROFT_TOPIC_PREFIX",)
    )
    group: str = setting("mycroft-sinks", "consumer group")
    prometheus_listen: str = setting(
        "", "serve /metrics on HOST:PORT", metavar="HOST:PORT", shown="off"
    )
    incident_ttl: float = setting(
        600.0,
        "seconds without a revision before an incident of a writer that never "
        "sends a closed revision (RootCause.1-3) closes",
        env=("MYCROFT_SINKS__INCIDENT_TTL_S",),
        metavar="S",
    )
    job_end: float = setting(
        60.0,
        "seconds without a heartbeat or result of a job before it counts as "
        "ended and its incidents close",
        env=("MYCROFT_SINKS__JOB_END_S",),
        metavar="S",
    )
    lag_group: tuple[str, ...] = setting(
        ("mycroft-streams",),
        "stream-worker consumer group (its --app-id) whose lag on the raw "
        "topics is exported with the metrics; repeatable, '' for none",
        env=("MYCROFT_SINKS__LAG_GROUPS",),
        metavar="GROUP",
    )
    opensearch_url: str = setting(
        "", "OpenSearch/Elasticsearch URL", metavar="URL", shown="off"
    )
    index_prefix: str = setting("mycroft", "index name prefix")
    refresh: str = setting(
        "", "_bulk refresh parameter, e.g. wait_for", shown="the server's"
    )
    retries: int = setting(8, "attempts per write before exiting uncommitted")
    security: KafkaSecurity = PLAINTEXT

    def __post_init__(self) -> None:
        for name in ("incident_ttl", "job_end"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0")
        if self.retries < 1:
            raise ConfigError("--retries must be at least 1")


def _parser() -> argparse.ArgumentParser:
    p = mycroft_parser("sinks", DESCRIPTION)
    add_config_flag(p)
    add_flags(p, SinksSettings, "sinks")
    add_security_flags(p, env_prefixes("sinks"))
    return p


def load_settings(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> SinksSettings:
    """Parse ``argv`` and merge it over the environment and the config file.

    Raises:
        ConfigError: a value of the wrong type, or settings that do not hold.
    """
    env = os.environ if env is None else env
    flags = vars(_parser().parse_args(list(argv)))
    security = security_from(flags, env, env_prefixes("sinks"))
    return load(SinksSettings, "sinks", flags, env, extra={"security": security})


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"--prometheus-listen must be HOST:PORT, not {listen!r}")
    return host or "127.0.0.1", int(port)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the forwarder until SIGTERM/SIGINT; return the exit code."""
    settings = load_settings(sys.argv[1:] if argv is None else argv)
    setup_logging()
    # Installed first: a SIGTERM while the consumer and sinks are being set
    # up stops the run before it forwards anything, instead of killing it.
    # Not restored on return: a late SIGTERM must not kill a run that is
    # flushing or closing (main() is the process's entry point).
    stop = StopSignal()
    stop.install()
    try:
        code = run(settings, stop)
    except (ConfigError, KafkaRefused):
        raise  # flags that do not combine, a refusal: the mycroft command's words
    except MycroftError as exc:
        logger.error("mycroft sinks: %s", exc)
        return 1
    if code == 0 and stop.signum == signal.SIGINT:
        return int(ExitCode.INTERRUPTED)  # Ctrl-C, as every command; SIGTERM: 0
    return code


def run(s: SinksSettings, stop: StopSignal) -> int:
    """Forward with the sinks of ``s`` until ``stop``; return the exit code.

    Raises:
        ConfigError: no bootstrap, no sink, or a bad listen address.
    """
    from mycroft.kafka_client import DecodingConsumer  # noqa: PLC0415 (keeps --help fast)
    from mycroft.topics import TopicSet  # noqa: PLC0415

    if not s.bootstrap:
        raise ConfigError("give --bootstrap HOST:PORT or set MYCROFT_BOOTSTRAP")
    if not (s.prometheus_listen or s.opensearch_url):
        raise ConfigError("give --prometheus-listen and/or --opensearch-url")
    topics = TopicSet(s.topic_prefix)
    sinks, closers = _build_sinks(s, topics)
    consumer = DecodingConsumer(
        s.bootstrap, s.group,
        [topics.anomaly, topics.rootcause, topics.heartbeat],
        topics.deadletter, auto_commit=False, extra=s.security.librdkafka(),
    )  # fmt: skip

    # Asynchronous, and dead letters flushed for at most 0.5 s: a synchronous
    # commit (or a flush) waits as long as Kafka is away, and Ctrl-C must stop
    # the sinks within 2 s. A commit that fails or is skipped is covered by
    # the next one (or the records are re-forwarded after a restart).
    forwarder = Forwarder(
        consumer, sinks,
        functools.partial(consumer.commit, asynchronous=True, flush_s=0.5),
        backoff=Backoff(attempts=s.retries), stopping=stop,
    )  # fmt: skip
    logger.info("forwarding %s, %s to %s", topics.anomaly, topics.rootcause,
                ", ".join(type(k).__name__ for k in sinks))  # fmt: skip
    code = 0
    meanwhile = "the sinks keep what they were given and read on once it answers"
    try:
        with BrokerWatch(s.bootstrap, meanwhile):
            forwarder.run(poll_s=0.3)
    except SinkError as exc:
        logger.error("giving up, offsets not committed: %s", exc)
        code = 1
    finally:
        consumer.close(timeout_s=0.7)  # Ctrl-C stops the sinks within 2 s
        for close in closers:
            close()
    logger.info("stopped: %s", forwarder.stats)
    return code


def _build_sinks(
    s: SinksSettings, topics: TopicSet
) -> tuple[list[Sink], list[Callable[[], None]]]:
    sinks: list[Sink] = []
    closers: list[Callable[[], None]] = []
    if s.prometheus_listen:
        from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415

        from mycroft.sinks.prometheus import PrometheusSink  # noqa: PLC0415

        host, port = _split_listen(s.prometheus_listen)
        registry = CollectorRegistry()
        prom = PrometheusSink(
            registry, incident_ttl_s=s.incident_ttl, job_end_s=s.job_end
        )
        server, thread = start_http_server(port, host, registry=registry)
        logger.info("serving metrics on http://%s:%d/metrics", host, port)
        sinks.append(prom)
        lag = _lag_monitor(s, topics, registry)

        def stop_http() -> None:
            if lag is not None:
                lag.close()
            prom.close()
            server.shutdown()
            server.server_close()
            thread.join(5)

        closers.append(stop_http)
    if s.opensearch_url:
        from mycroft.sinks.opensearch import OpenSearchSink  # noqa: PLC0415

        search = OpenSearchSink(
            s.opensearch_url, s.index_prefix, refresh=s.refresh or None
        )
        sinks.append(search)
        closers.append(search.close)
    return sinks, closers


def _lag_monitor(
    s: SinksSettings, topics: TopicSet, registry: CollectorRegistry
) -> LagMonitor | None:
    groups = list(s.lag_group)
    if not groups:
        return None
    from mycroft.sinks.lag import LagMonitor  # noqa: PLC0415

    raw = [topics.topology, topics.state, topics.completion, topics.heartbeat]
    monitor = LagMonitor(
        s.bootstrap, groups, raw, registry, extra=s.security.librdkafka()
    )
    monitor.start()
    logger.info("exporting the lag of %s", ", ".join(groups))
    return monitor


if __name__ == "__main__":
    sys.exit(main())
