"""``mycroft sinks run``: forward detection results from Kafka to the sinks.

Consumes the anomaly, root-cause and heartbeat topics with a
:class:`~mycroft.kafka_client.DecodingConsumer` (bad records go to the dead
letters), writes every record to each configured sink, flushes, and only then
commits the offsets: at-least-once. Sinks are idempotent (anomaly ids,
incident ids with revisions), so re-delivery after a crash is harmless.
Heartbeats only tell sinks that track jobs (:class:`JobWatcher`, the
Prometheus sink) that the job still runs: one silent for ``--job-end``
seconds has ended and its incidents close.

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
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mycroft.errors import ConfigError, MycroftError, SinkError
from mycroft.kafka_security import add_flags as add_security_flags
from mycroft.kafka_security import security_from
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
            self._commit()
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


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def _parser(env: dict[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mycroft sinks run", description=__doc__.split("\n")[0]
    )
    add = p.add_argument
    add(
        "--bootstrap",
        default=env.get("MYCROFT_BOOTSTRAP"),
        help="Kafka bootstrap servers (env MYCROFT_BOOTSTRAP)",
    )
    add(
        "--topic-prefix",
        default=env.get("MYCROFT_TOPIC_PREFIX", ""),
        help="namespace prefix of the topics (env MYCROFT_TOPIC_PREFIX)",
    )
    add(
        "--group",
        default=env.get("MYCROFT_SINKS__GROUP", "mycroft-sinks"),
        help="consumer group (env MYCROFT_SINKS__GROUP)",
    )
    add(
        "--prometheus-listen",
        default=env.get("MYCROFT_SINKS__PROMETHEUS_LISTEN"),
        help="serve /metrics on HOST:PORT (env MYCROFT_SINKS__PROMETHEUS_LISTEN)",
    )
    add(
        "--incident-ttl",
        type=_positive,
        default=float(env.get("MYCROFT_SINKS__INCIDENT_TTL_S", "600")),
        help="seconds without a revision before an incident closes (default 600)",
    )
    add(
        "--job-end",
        type=_positive,
        default=float(env.get("MYCROFT_SINKS__JOB_END_S", "60")),
        help="seconds without a heartbeat or result of a job before it counts as "
        "ended and its incidents close (env MYCROFT_SINKS__JOB_END_S, default 60)",
    )
    add(
        "--lag-group",
        action="append",
        help="stream-worker consumer group (its --app-id) whose lag on the raw "
        "topics is exported with the Prometheus metrics; repeatable "
        "(env MYCROFT_SINKS__LAG_GROUPS, comma-separated; default mycroft-streams)",
    )
    add(
        "--opensearch-url",
        default=env.get("MYCROFT_SINKS__OPENSEARCH_URL"),
        help="OpenSearch/Elasticsearch URL (env MYCROFT_SINKS__OPENSEARCH_URL)",
    )
    add(
        "--index-prefix",
        default=env.get("MYCROFT_SINKS__INDEX_PREFIX", "mycroft"),
        help="index name prefix (env MYCROFT_SINKS__INDEX_PREFIX)",
    )
    add(
        "--refresh",
        default=env.get("MYCROFT_SINKS__REFRESH"),
        help="_bulk refresh parameter, e.g. wait_for (env MYCROFT_SINKS__REFRESH)",
    )
    add(
        "--retries",
        type=int,
        default=int(env.get("MYCROFT_SINKS__RETRIES", "8")),
        help="attempts per write before exiting uncommitted (default 8)",
    )
    add_security_flags(p, "MYCROFT_")
    return p  # fmt: skip


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"--prometheus-listen must be HOST:PORT, not {listen!r}")
    return host or "127.0.0.1", int(port)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the forwarder until SIGTERM/SIGINT; return the exit code."""
    args = _parser(dict(os.environ)).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    # Installed first: a SIGTERM while the consumer and sinks are being set
    # up stops the run before it forwards anything, instead of killing it.
    # Not restored on return: a late SIGTERM must not kill a run that is
    # flushing or closing (main() is the process's entry point).
    stop = StopSignal()
    stop.install()
    try:
        return _run(args, stop)
    except ConfigError:
        raise  # flags that do not combine: the mycroft command's usage error
    except MycroftError as exc:
        logger.error("mycroft sinks run: %s", exc)
        return 1


def _run(args: argparse.Namespace, stop: StopSignal) -> int:
    from mycroft.kafka_client import DecodingConsumer  # noqa: PLC0415 (keeps --help fast)
    from mycroft.topics import TopicSet  # noqa: PLC0415

    if not args.bootstrap:
        raise ConfigError("give --bootstrap HOST:PORT or set MYCROFT_BOOTSTRAP")
    if not (args.prometheus_listen or args.opensearch_url):
        raise ConfigError("give --prometheus-listen and/or --opensearch-url")
    topics = TopicSet(args.topic_prefix)
    sinks, closers = _build_sinks(args, topics)
    consumer = DecodingConsumer(
        args.bootstrap, args.group,
        [topics.anomaly, topics.rootcause, topics.heartbeat],
        topics.deadletter, auto_commit=False, extra=_kafka_extra(args),
    )  # fmt: skip

    forwarder = Forwarder(
        consumer, sinks, consumer.commit,
        backoff=Backoff(attempts=args.retries), stopping=stop,
    )  # fmt: skip
    logger.info("forwarding %s, %s to %s", topics.anomaly, topics.rootcause,
                ", ".join(type(s).__name__ for s in sinks))  # fmt: skip
    code = 0
    try:
        forwarder.run()
    except SinkError as exc:
        logger.error("giving up, offsets not committed: %s", exc)
        code = 1
    finally:
        consumer.close()
        for close in closers:
            close()
    logger.info("stopped: %s", forwarder.stats)
    return code


def _kafka_extra(args: argparse.Namespace) -> dict[str, Any]:
    """librdkafka security settings of the flags, then ``MYCROFT_*`` variables."""
    return dict(security_from(vars(args), os.environ, "MYCROFT_").librdkafka())


def _lag_groups(args: argparse.Namespace) -> list[str]:
    given = args.lag_group
    if given is None:
        env = os.environ.get("MYCROFT_SINKS__LAG_GROUPS", "mycroft-streams")
        given = env.split(",")
    return [g.strip() for g in given if g.strip()]


def _build_sinks(
    args: argparse.Namespace, topics: TopicSet
) -> tuple[list[Sink], list[Callable[[], None]]]:
    sinks: list[Sink] = []
    closers: list[Callable[[], None]] = []
    if args.prometheus_listen:
        from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415

        from mycroft.sinks.prometheus import PrometheusSink  # noqa: PLC0415

        host, port = _split_listen(args.prometheus_listen)
        registry = CollectorRegistry()
        prom = PrometheusSink(
            registry, incident_ttl_s=args.incident_ttl, job_end_s=args.job_end
        )
        server, thread = start_http_server(port, host, registry=registry)
        logger.info("serving metrics on http://%s:%d/metrics", host, port)
        sinks.append(prom)
        lag = _lag_monitor(args, topics, registry)

        def stop_http() -> None:
            if lag is not None:
                lag.close()
            prom.close()
            server.shutdown()
            server.server_close()
            thread.join(5)

        closers.append(stop_http)
    if args.opensearch_url:
        from mycroft.sinks.opensearch import OpenSearchSink  # noqa: PLC0415

        search = OpenSearchSink(
            args.opensearch_url, args.index_prefix, refresh=args.refresh
        )
        sinks.append(search)
        closers.append(search.close)
    return sinks, closers


def _lag_monitor(
    args: argparse.Namespace, topics: TopicSet, registry: CollectorRegistry
) -> LagMonitor | None:
    groups = _lag_groups(args)
    if not groups:
        return None
    from mycroft.sinks.lag import LagMonitor  # noqa: PLC0415

    raw = [topics.topology, topics.state, topics.completion, topics.heartbeat]
    monitor = LagMonitor(
        args.bootstrap, groups, raw, registry, extra=_kafka_extra(args)
    )
    monitor.start()
    logger.info("exporting the lag of %s", ", ".join(groups))
    return monitor


if __name__ == "__main__":
    sys.exit(main())
