"""Settings of the Faust stream worker: one frozen object, validated once in main.

Every flag of ``mycroft streams worker`` has a ``MYCROFT_STREAMS__<NAME>``
equivalent (the flag wins). Nothing here reads the environment at import time.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from mycroft.errors import ConfigError
from mycroft.kafka_security import PLAINTEXT, KafkaSecurity, add_flags, security_from

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
        metrics_port: Port of the worker's Prometheus ``/metrics``
            (``mycroft_invalid_records_total`` and others,
            ``streams/invalid_records.py``); 0 serves none.
        data_dir: Faust data directory.
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
        security: TLS and SASL settings of every Kafka client of the
            worker (``--security-protocol`` ... or
            ``MYCROFT_STREAMS__SECURITY_PROTOCOL`` ...; ``infra/SECURITY.md``).
    """

    bootstrap: str
    app_id: str = "mycroft-streams"
    prefix: str = ""
    partitions: int = 8
    evaluate_interval_s: float = 0.2
    snapshot_interval_s: float = 1.0
    web_port: int = 0
    metrics_port: int = 0
    data_dir: str = "mycroft-streams-data"
    rates: bool = True
    session_timeout_s: float = 10.0
    loglevel: str = "info"
    stats_interval_s: float = 10.0
    job_idle_s: float = 120.0
    stage: str = "single"
    comm_groups: int = 8
    trace_speed: float = 1.0
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

    def _check_stage(self) -> None:
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
        """``data_dir`` as a path."""
        return Path(self.data_dir)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mycroft streams", description=__doc__)
    p.add_argument("command", choices=["worker"], help="what to run")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers")
    p.add_argument("--app-id")
    p.add_argument("--prefix", help="topic namespace prefix")
    p.add_argument("--partitions", type=int)
    p.add_argument("--evaluate-interval-s", type=float)
    p.add_argument("--snapshot-interval-s", type=float)
    p.add_argument("--web-port", type=int, help="0 disables the web server")
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus /metrics here (0: off)"
    )
    p.add_argument("--data-dir")
    p.add_argument("--rates", choices=["on", "off"], help="windowed rate tables")
    p.add_argument("--session-timeout-s", type=float)
    p.add_argument("--loglevel", "-l")
    p.add_argument("--stats-interval-s", type=float)
    p.add_argument("--job-idle-s", type=float, help="evict jobs silent this long")
    p.add_argument(
        "--stage", choices=STAGES, help="single (default) or a two-stage worker stage"
    )
    p.add_argument("--comm-groups", type=int, help="comm groups per job (two-stage)")
    p.add_argument(
        "--trace-speed", type=float, help="deprecated, ignored: verdicts use event time"
    )
    add_flags(p, ENV_PREFIX)
    return p


def _coerce(name: str, raw: str) -> object:
    kind = {f.name: f.type for f in fields(StreamSettings)}[name]
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            return raw.strip().lower() in {"1", "true", "yes", "on"}
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {exc}") from exc
    return raw


def parse_settings(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[str, StreamSettings]:
    """Return ``(command, settings)`` from flags, then ``MYCROFT_STREAMS__*``.

    Raises:
        ConfigError: a value is missing or invalid.
    """
    env = os.environ if env is None else env
    ns = vars(_parser().parse_args(list(argv)))
    command = ns.pop("command")
    values: dict[str, object] = {}
    values["security"] = security_from(ns, env, ENV_PREFIX)
    for f in fields(StreamSettings):
        if f.name == "security":
            continue
        flag = ns.get(f.name)
        if f.name == "rates" and flag is not None:
            flag = flag == "on"
        if flag is not None:
            values[f.name] = flag
        elif (raw := env.get(ENV_PREFIX + f.name.upper())) is not None:
            values[f.name] = _coerce(f.name, raw)
    if "bootstrap" not in values:
        raise ConfigError("--bootstrap (or MYCROFT_STREAMS__BOOTSTRAP) is required")
    return command, StreamSettings(**values)  # type: ignore[arg-type]  # validated in __post_init__


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
