"""Settings of the Faust stream worker: one frozen object, validated once in main.

Every flag of ``mycroft streams worker`` has a ``MYCROFT_STREAMS__<NAME>``
equivalent and a key of the ``[streams]`` table of the config file (the flag
wins, then the variable; :mod:`mycroft.config`). Nothing here reads the
environment at import time.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from mycroft.cli_parser import mycroft_parser
from mycroft.config import add_config_flag, add_flags, load, setting, state_dir
from mycroft.errors import ConfigError
from mycroft.kafka_security import (
    PLAINTEXT,
    KafkaSecurity,
    env_prefixes,
    security_from,
)
from mycroft.kafka_security import add_flags as add_flags_security
from mycroft.streams.core.config import DetectorConfig, with_overrides

_APP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_HOSTPORT = re.compile(r"^[^\s:,]+:\d{1,5}$")
ENV_PREFIX = "MYCROFT_STREAMS__"
STAGES = ("single", "split", "comm", "job")


@dataclass(frozen=True)
class StreamSettings:
    """Everything the Faust app needs; built once, passed down.

    Attributes:
        bootstrap: Kafka bootstrap servers, ``host:port[,host:port...]``.
        app_id: Faust app id: consumer group and prefix of internal topics.
        prefix: Namespace prefix of Mycroft's topics (see ``TopicSet``).
        partitions: Partitions of every source topic, table and tick topic.
        evaluate_interval_s: Wall period of the tick that advances each job's
            event clock (``streams/core/event_time.py``): records the
            watermark passed reach the engine, with an evaluation every
            100 ms of event time in between, whatever this period.
        snapshot_interval_s: Period of engine snapshots + offset commits.
        web_port: Faust web port; 0 disables the web server.
        web_address: Address the web server listens on (loopback unless told).
        metrics_port: Port of the worker's Prometheus ``/metrics``
            (``mycroft_invalid_records_total`` and others,
            ``streams/invalid_records.py``); 0 serves none.
        metrics_address: Address ``/metrics`` listens on: loopback unless
            told (a deployment scraped from another host sets 0.0.0.0).
        data_dir: Faust data folder; ``''`` is :func:`mycroft.config.state_dir`
            ``/streams`` (``$XDG_STATE_HOME/mycroft/streams``, else
            ``~/.local/state/mycroft/streams``).
        rates: Maintain the windowed per-rank/per-comm rate tables.
        session_timeout_s: Kafka consumer session timeout.
        loglevel: Worker log level.
        stats_interval_s: Period of the stats log line (rows/s, lag, counters).
        job_idle_s: A job without records for this long is evicted from the
            worker (its snapshot deleted); it starts afresh if records return.
        stage: ``single`` (one stage per job, the default) or one stage of
            the two-stage worker (``streams/SCALING.md``): ``split`` (stage
            0: raw rows -> comm groups), ``comm`` (stage 1: per comm group
            detection and summaries) or ``job`` (stage 2: per job root cause).
        comm_groups: Comm groups per job in the two-stage worker; ``split``
            and ``comm`` workers must agree on it.
        trace_speed: Deprecated, read by nothing: verdicts follow each job's
            event time (``streams/core/event_time.py``) whatever the pace
            its records are published at. Still accepted (0.01..100) so
            that existing command lines and configs keep working.
        detector: Overrides of the detectors' thresholds, ``KEY=VALUE``
            pairs separated by commas, keys and reasons in
            ``DetectorConfig`` (``streams/core/config.py``); ``''``: the
            defaults, which the campaigns measure. Every worker of a
            deployment must run the same (verdicts depend on them);
            ``mycroft analyze --set`` takes the same pairs.
        security: TLS and SASL settings of every Kafka client of the
            worker (``--security-protocol`` ... or
            ``MYCROFT_STREAMS__SECURITY_PROTOCOL`` ...; ``infra/SECURITY.md``).
    """

    bootstrap: str = setting(
        doc="Kafka bootstrap servers",
        env=("MYCROFT_BOOTSTRAP",),  # shared by every command, as the others read it
        metavar="HOST:PORT[,...]",
    )
    app_id: str = setting(
        "mycroft-streams", "Faust app id: consumer group, internal topics' prefix"
    )
    prefix: str = setting("", "namespace prefix of Mycroft's topics")
    partitions: int = setting(8, "partitions of every source, table and tick topic")
    evaluate_interval_s: float = setting(0.2, "wall period of the event-clock tick, s")
    snapshot_interval_s: float = setting(
        1.0, "period of engine snapshots and offset commits, s"
    )
    web_port: int = setting(0, "Faust web port (0: off)")
    web_address: str = setting(
        "127.0.0.1",
        "address the Faust web server listens on (0.0.0.0: all)",
        metavar="ADDRESS",
    )
    metrics_port: int = setting(0, "serve Prometheus /metrics on this port (0: off)")
    metrics_address: str = setting(
        "127.0.0.1",
        "address /metrics listens on (0.0.0.0: every interface, "
        "for a Prometheus on another host)",
        metavar="ADDRESS",
    )
    data_dir: str = setting(
        "", "Faust data folder", shown="$XDG_STATE_HOME/mycroft/streams", metavar="DIR"
    )
    rates: bool = setting(True, "windowed per-rank and per-comm rate tables")
    session_timeout_s: float = setting(10.0, "Kafka consumer session timeout, s")
    loglevel: str = setting("info", "debug, info, warning or error")
    stats_interval_s: float = setting(10.0, "period of the stats log line, s")
    job_idle_s: float = setting(120.0, "evict jobs silent this long, s")
    stage: str = setting(
        "single", "single, or one stage of the two-stage worker", choices=STAGES
    )
    comm_groups: int = setting(8, "comm groups per job (two-stage worker)")
    trace_speed: float = setting(1.0, "deprecated, ignored: verdicts use event time")
    detector: str = setting(
        "",
        "detector threshold overrides, KEY=VALUE[,KEY=VALUE...] "
        "(DetectorConfig, streams/core/config.py)",
        metavar="KEY=VALUE,...",
    )
    security: KafkaSecurity = PLAINTEXT

    def __post_init__(self) -> None:
        servers = self.bootstrap.split(",") if self.bootstrap else []
        if not servers or not all(_HOSTPORT.match(s) for s in servers):
            raise ConfigError(
                f"bootstrap must be host:port[,...], got {self.bootstrap!r}"
            )
        if not _APP_ID.match(self.app_id):
            raise ConfigError(f"app id {self.app_id!r} must match {_APP_ID.pattern}")
        if self.prefix and not re.match(r"^[A-Za-z0-9._-]+$", self.prefix):
            raise ConfigError(f"topic prefix {self.prefix!r} has invalid characters")
        if not 1 <= self.partitions <= 10_000:
            raise ConfigError(f"partitions must be 1..10000, got {self.partitions}")
        if not 0.01 <= self.evaluate_interval_s <= 10:
            raise ConfigError("evaluate interval must be 0.01..10 s")
        if self.snapshot_interval_s < self.evaluate_interval_s:
            raise ConfigError("snapshot interval must be >= the evaluate interval")
        if not (self.web_port == 0 or 1024 <= self.web_port <= 65535):
            raise ConfigError(
                f"web port must be 0 (off) or 1024..65535: {self.web_port}"
            )
        if not (self.metrics_port == 0 or 1024 <= self.metrics_port <= 65535):
            raise ConfigError(
                f"metrics port must be 0 (off) or 1024..65535: {self.metrics_port}"
            )
        if self.session_timeout_s < 6:
            raise ConfigError("Kafka needs a session timeout of at least 6 s")
        if self.stats_interval_s <= 0:
            raise ConfigError("stats interval must be positive")
        if self.job_idle_s < 10 * self.snapshot_interval_s:
            raise ConfigError("job idle time must be >= 10 snapshot intervals")
        if self.loglevel.lower() not in {"debug", "info", "warning", "error"}:
            raise ConfigError(f"unknown log level {self.loglevel!r}")
        self._check_stage()

    def detector_config(self) -> DetectorConfig:
        """The engines' thresholds: the defaults with ``detector``'s overrides."""
        return with_overrides(DetectorConfig(), self.detector)

    def _check_stage(self) -> None:
        try:
            self.detector_config()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.stage not in STAGES:
            raise ConfigError(
                f"stage must be one of {', '.join(STAGES)}, got {self.stage!r}"
            )
        if not 1 <= self.comm_groups <= 4096:
            raise ConfigError(f"comm groups must be 1..4096, got {self.comm_groups}")
        if not 0.01 <= self.trace_speed <= 100:
            raise ConfigError(
                "trace speed must be 0.01..100 trace s per wall s, "
                f"got {self.trace_speed}"
            )

    @property
    def group_id(self) -> str:
        """Faust app id of this stage: ``app_id``, suffixed by the stage if not single.

        Each stage is its own consumer group with its own tick topic and
        tables, so the stages of one deployment can share ``--app-id``.
        """
        return self.app_id if self.stage == "single" else f"{self.app_id}-{self.stage}"

    @property
    def web_enabled(self) -> bool:
        """Whether Faust's web server runs."""
        return self.web_port != 0

    @property
    def data_path(self) -> Path:
        """``data_dir`` as a path, the state folder's ``streams`` if unset."""
        return Path(self.data_dir) if self.data_dir else state_dir() / "streams"


DESCRIPTION = (
    "Run a stream worker: it reads the raw trace topics of the jobs it is "
    "handed, detects hangs, slowdowns and mismatches, names their root cause, "
    "and publishes both. Workers with the same --app-id share the jobs; "
    "--stage runs one stage of the two-stage worker for jobs too large for "
    "one (streams/SCALING.md)."
)
WORKER = (
    f"{DESCRIPTION} Settings: flag, then environment (the variables shown), "
    "then the [streams] table of --config, then the default."
)


def _parser() -> argparse.ArgumentParser:
    p = mycroft_parser("streams", DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    worker = sub.add_parser("worker", help="run a stream worker", description=WORKER)
    add_config_flag(worker)
    add_flags(worker, StreamSettings, "streams")
    add_flags_security(worker, env_prefixes("streams"))
    return p


def parse_settings(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[str, StreamSettings]:
    """Return ``(command, settings)`` from flags, ``MYCROFT_STREAMS__*``, the file.

    Raises:
        ConfigError: a value is missing or invalid.
    """
    env = os.environ if env is None else env
    ns = vars(_parser().parse_args(list(argv)))
    security = security_from(ns, env, env_prefixes("streams"))
    settings = load(StreamSettings, "streams", ns, env, extra={"security": security})
    return ns["command"], settings


def to_argv(settings: StreamSettings) -> list[str]:
    """``mycroft streams worker`` flags that :func:`parse_settings` reads back
    as ``settings`` (every field, so the child ignores the parent's env)."""
    argv = ["worker"]
    for f in fields(StreamSettings):
        value = getattr(settings, f.name)
        if f.name == "security":
            continue
        if f.name == "rates":
            value = "on" if value else "off"
        argv += [f"--{f.name.replace('_', '-')}", str(value)]
    return argv + settings.security.to_flags()


def child_env(settings: StreamSettings) -> dict[str, str]:
    """Variables a child worker of ``settings`` needs beyond :func:`to_argv`:
    the SASL password, which never goes on a command line."""
    if not settings.security.sasl:
        return {}
    return {ENV_PREFIX + "SASL_PASSWORD": settings.security.password.reveal()}
