"""``mycroft agent``: the node agent entry point."""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from mycroft import kafka_security
from mycroft.errors import ConfigError
from mycroft.producers.agent import config
from mycroft.producers.agent.daemon import Agent
from mycroft.producers.agent.metrics import AgentMetrics
from mycroft.producers.agent.shipper import KafkaTransport, Shipper
from mycroft.producers.agent.sources import ReplaySource, RingSource, simulate_host
from mycroft.producers.agent.spool import Spool
from mycroft.stop_signal import StopSignal
from mycroft.topics import TopicSet

log = logging.getLogger(__name__)

_SECURITY_KEYS = set(kafka_security.KEYS)

_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("job-id", str, "training job id (Kafka key)"),
    ("host", str, "host name stamped on batches (default: hostname)"),
    ("source", str, "ring | sim | replay"),
    ("ring-dir", str, "folder of ring files (default /dev/shm/mycroft)"),
    ("ring-glob", str, "ring file pattern (default *.ring)"),
    ("replay-file", str, "trace file for --source replay"),
    ("replay-speed", float, "replay pace, 1.0 = real time, 0 = at once"),
    ("sim-args", str, "mycroft simulate arguments for --source sim (no --out)"),
    ("sim-start-s", float, "simulated job start, Unix s (0: aligned to 10 s)"),
    ("interval-ms", int, "sampling tick, ms (default 100)"),
    ("heartbeat-s", float, "heartbeat period, s (default 1)"),
    ("nic-sysfs", str, "RDMA sysfs folder for NIC port state ('': off)"),
    ("bootstrap", str, "Kafka bootstrap servers"),
    ("topic-prefix", str, "topic name prefix (tests, tenants)"),
    ("partitions", int, "override every topic's partition count"),
    ("spool-dir", str, "disk spool folder"),
    ("spool-max-bytes", int, "spool bound, bytes (default 256 MiB)"),
    ("spool-segment-bytes", int, "spool segment size, bytes (default 8 MiB)"),
    ("spool-fsync-s", float, "fsync the spool at most this often, s (0: every tick)"),
    ("delivery-timeout-ms", int, "librdkafka message.timeout.ms (default 120000)"),
    ("retry-s", float, "probe period while Kafka is unreachable, s"),
    ("shutdown-flush-s", float, "how long SIGTERM waits for deliveries, s"),
    ("metrics-port", int, "Prometheus port (0: off)"),
    ("metrics-addr", str, "Prometheus listen address"),
    ("duration-s", float, "stop after this long (0: run until SIGTERM)"),
    ("log-level", str, "DEBUG, INFO, WARNING, ERROR"),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mycroft agent",
        description="Node agent: drains trace rings and ships them durably to Kafka. "
        "Precedence: flags > MYCROFT_* env > --config file.",
    )
    p.add_argument("--config", type=Path, help="TOML or JSON file ([agent] table)")
    for name, typ, doc in _FLAGS:
        p.add_argument(f"--{name}", type=typ, default=None, help=doc)
    p.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting, e.g. security.protocol=SASL_SSL (repeatable)",
    )
    kafka_security.add_flags(p, "MYCROFT_")
    return p


def load_settings(argv: Sequence[str], env: Mapping[str, str]) -> config.Settings:
    """Parse flags and merge them over the environment and the config file."""
    args = _parser().parse_args(list(argv))
    path = args.config or (
        Path(env["MYCROFT_CONFIG"]) if env.get("MYCROFT_CONFIG") else None
    )
    file_values = config.read_file(path) if path else {}
    file_security = {
        k: file_values.pop(k) for k in list(file_values) if k in _SECURITY_KEYS
    }
    flags: dict[str, Any] = {
        n.replace("-", "_"): getattr(args, n.replace("-", "_")) for n, _, _ in _FLAGS
    }
    kafka = {}
    for opt in args.kafka_option:
        key, sep, value = opt.partition("=")
        if not sep:
            raise ConfigError(f"--kafka-option {opt.split('=')[0]!r} needs KEY=VALUE")
        kafka[key.strip()] = value
    if kafka:
        flags["kafka"] = kafka
    security = kafka_security.security_from(
        vars(args), env, "MYCROFT_", {k: str(v) for k, v in file_security.items()}
    )
    settings = config.build(file_values, config.from_env(env), flags)
    return dataclasses.replace(settings, security=security)


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
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
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
    return 0
