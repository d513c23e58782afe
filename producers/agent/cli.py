"""``mycroft agent``: the node agent entry point."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from mycroft import config as mycroft_config
from mycroft import kafka_security
from mycroft.cli_errors import ExitCode
from mycroft.cli_parser import mycroft_parser
from mycroft.config import add_flags
from mycroft.errors import ConfigError
from mycroft.logs import setup_logging
from mycroft.producers.agent import config
from mycroft.producers.agent.daemon import Agent
from mycroft.producers.agent.metrics import AgentMetrics
from mycroft.producers.agent.shipper import KafkaTransport, Shipper
from mycroft.producers.agent.sources import ReplaySource, RingSource, simulate_host
from mycroft.producers.agent.spool import Spool
from mycroft.stop_signal import StopSignal
from mycroft.topics import TopicSet

log = logging.getLogger(__name__)


DESCRIPTION = (
    "The node agent, one per GPU host: drains the trace rings the training "
    "processes write, batches them per sampling tick and ships them to Kafka, "
    "spooling to disk while Kafka is away. Settings: flag, then environment "
    "(the variables shown), then --config (TOML or JSON, [agent] table), then "
    "the default."
)


def _parser() -> argparse.ArgumentParser:
    p = mycroft_parser("agent", DESCRIPTION)
    p.add_argument(
        "--config",
        type=Path,
        help="TOML or JSON settings file, [agent] table (default: $MYCROFT_CONFIG)",
    )
    add_flags(p, config.Settings, "agent")
    p.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting, e.g. security.protocol=SASL_SSL (repeatable; "
        "env MYCROFT_KAFKA__<KEY>, dots as underscores)",
    )
    kafka_security.add_flags(p, kafka_security.env_prefixes("agent"))
    return p


def load_settings(argv: Sequence[str], env: Mapping[str, str]) -> config.Settings:
    """Parse flags and merge them over the environment and the config file."""
    args = _parser().parse_args(list(argv))
    path = mycroft_config.config_path(vars(args), env)
    file_security, file_values = kafka_security.split_security(
        config.read_file(path) if path else {}
    )
    kafka = {str(k): str(v) for k, v in dict(file_values.pop("kafka", {})).items()}
    kafka |= config.kafka_from_env(env)
    for opt in args.kafka_option:
        key, sep, value = opt.partition("=")
        if not sep:
            raise ConfigError(f"--kafka-option {opt.split('=')[0]!r} needs KEY=VALUE")
        kafka[key.strip()] = value
    security = kafka_security.security_from(
        vars(args), env, kafka_security.env_prefixes("agent"), file_security
    )
    return mycroft_config.load(
        config.Settings,
        "agent",
        vars(args),
        env,
        file_values=file_values,
        file_name=str(path),
        extra={"kafka": kafka, "security": security},
    )


def build_agent(s: config.Settings, registry: CollectorRegistry | None) -> Agent:
    """Wire the source, spool, Kafka transport and metrics of ``s``."""
    if not s.bootstrap:
        raise ConfigError("bootstrap is required (--bootstrap or MYCROFT_BOOTSTRAP)")
    spool = Spool(
        s.spool_dir, s.spool_max_bytes, s.spool_segment_bytes, s.spool_fsync_s
    )
    topics = TopicSet(s.topic_prefix, s.partitions or None)
    source: RingSource | ReplaySource
    if s.source == "ring":
        source = RingSource(s.ring_dir, s.ring_glob, spool.checkpoint)
    elif s.source == "sim":
        trace = simulate_host(
            s.sim_args, s.host, s.job_id, Path(s.spool_dir), s.sim_start_s
        )
        source = ReplaySource(trace, 1.0)
    else:
        source = ReplaySource(s.replay_file, s.replay_speed, spool.checkpoint)
    shipper = Shipper(
        spool, KafkaTransport(s.bootstrap, topics, s.kafka_config()), retry_s=s.retry_s
    )
    metrics = AgentMetrics(registry) if registry is not None else None
    return Agent(
        job_id=s.job_id,
        host=s.host,
        source=source,
        shipper=shipper,
        topics=topics,
        interval_ms=s.interval_ms,
        heartbeat_s=s.heartbeat_s,
        metrics=metrics,
        nic_sysfs=s.nic_sysfs,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT (or ``--duration-s``); return an exit code."""
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"mycroft agent: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    log.info("settings: %s", settings.redacted())
    registry = CollectorRegistry()
    try:
        agent = build_agent(settings, registry)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    server = None
    if settings.metrics_port:
        server, _thread = start_http_server(
            settings.metrics_port, settings.metrics_addr, registry=registry
        )
    stop = StopSignal()  # a threading.Event here could deadlock its handler
    stop.install()
    # `kill -USR1 <pid>` writes every thread's stack to stderr (the log): what
    # a daemon that does not stop or stops shipping is doing, without a debugger.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        agent.run(stop, settings.duration_s, settings.shutdown_flush_s)
    finally:
        agent.source.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    return int(ExitCode.INTERRUPTED) if stop.signum == signal.SIGINT else 0
