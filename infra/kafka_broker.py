"""Run a real single-node Apache Kafka 4.x broker (KRaft) from Maven Central jars.

The jars are resolved once with Maven into a cache folder; each :class:`KafkaBroker`
formats its own work folder and runs ``kafka.Kafka`` on two free loopback ports.
Tests use it through ``tests/conftest.py``; CI and humans use the CLI::

    mycroft broker fetch
    mycroft broker start   # prints the bootstrap; in $XDG_STATE_HOME/mycroft/broker
    mycroft broker stop
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from mycroft.cli_parser import mycroft_parser
from mycroft.config import add_flags, load, setting, state_dir
from mycroft.errors import BrokerError, ConfigError, MycroftError
from mycroft.infra import _kafka_props as kp
from mycroft.infra._kafka_props import check_bootstrap
from mycroft.infra._service import LocalService
from mycroft.kafka_logging import client_logger
from mycroft.logs import setup_logging

__all__ = ["KafkaBroker", "check_bootstrap", "default_cache_dir", "fetch_jars", "main"]

logger = logging.getLogger(__name__)


def _resource_text(name: str) -> str:
    """Read a file shipped as package data under ``mycroft.infra/kafka/``."""
    return resources.files("mycroft.infra").joinpath("kafka", name).read_text("utf-8")


def kafka_version() -> str:
    """Return the Kafka version pinned in the packaged ``pom.xml``."""
    pom = _resource_text("pom.xml")
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    if found is None:
        raise BrokerError("packaged kafka/pom.xml lacks <kafka.version>; reinstall")
    return found.group(1).strip()


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Return where the broker jars live.

    Args:
        env: environment to read ``MYCROFT_CACHE_DIR`` from; ``os.environ`` if None.

    Returns:
        ``$MYCROFT_CACHE_DIR/kafka-<version>`` when set, else
        ``<repository or cwd>/.cache/kafka-<version>``.
    """
    env = os.environ if env is None else env
    name = f"kafka-{kafka_version()}"
    if env.get("MYCROFT_CACHE_DIR"):
        return Path(env["MYCROFT_CACHE_DIR"]).expanduser() / name
    repo = Path(__file__).resolve().parent.parent
    base = repo if (repo / "pyproject.toml").is_file() else Path.cwd()
    return base / ".cache" / name


def fetch_jars(
    cache_dir: Path | None = None, *, env: Mapping[str, str] | None = None
) -> Path:
    """Resolve the broker's jars with Maven once; later calls only read a marker.

    Args:
        cache_dir: folder for the jars; :func:`default_cache_dir` if None.
        env: environment for :func:`default_cache_dir`; ``os.environ`` if None.

    Returns:
        The folder holding the jars (the classpath is ``<folder>/*``).

    Raises:
        BrokerError: mvn or java is missing, or mvn failed (the message names its log).
    """
    cache = (cache_dir or default_cache_dir(env)).resolve()
    pom = _resource_text("pom.xml")
    digest = hashlib.sha256(pom.encode()).hexdigest()
    if kp.jars_ready(cache, digest):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    with kp.file_lock(cache / ".lock"):
        if not kp.jars_ready(cache, digest):
            logger.info("resolving Kafka jars with Maven into %s", cache)
            kp.run_mvn(cache, pom)
            jars = kp.write_marker(cache, digest)
            logger.info("fetched %d Kafka jars into %s", len(jars), cache)
    return cache


class KafkaBroker(LocalService):
    """A single-node KRaft broker+controller on two loopback ports.

    ``start()`` after ``stop()`` reuses the same ports and data folder, so clients
    configured with the old bootstrap reconnect and data survives. A broker still
    running when the object is collected or Python exits is stopped, unless it was
    started with ``detach=True``.

    Args:
        workdir: folder for config, data and logs; a new temporary folder if None.
        heap_mb: maximum JVM heap in MiB.
        cache_dir: where the jars are; :func:`default_cache_dir` if None.
        keep: keep a temporary ``workdir`` after :meth:`close`.
    """

    display_name = "the broker"
    log_name = "broker.log"
    error = BrokerError

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        heap_mb: int = 512,
        cache_dir: Path | None = None,
        keep: bool = False,
    ) -> None:
        if heap_mb < kp.MIN_HEAP_MB:
            raise ConfigError(f"heap_mb={heap_mb} is below {kp.MIN_HEAP_MB}; raise it")
        super().__init__(workdir, keep=keep, prefix="mycroft-kafka-")
        self._heap_mb = heap_mb
        self._cache_dir = cache_dir
        self._ports: kp.BrokerPorts | None = None
        self._admin: AdminClient | None = None  # kept: a collected one fails futures

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the client listener; fixed after the first start."""
        if self._ports is None:
            raise BrokerError("the broker has no ports yet; call start() first")
        return f"{kp.HOST}:{self._ports.client}"

    def start(self, timeout_s: float = 120.0, *, detach: bool = False) -> str:
        """Start the broker and wait until it answers metadata requests.

        Args:
            timeout_s: how long to wait for readiness, in seconds.
            detach: run in its own session and leave it running when this object is
                collected or Python exits (what the CLI does).

        Returns:
            The bootstrap string ``127.0.0.1:PORT``.

        Raises:
            BrokerError: jars, java or formatting failed, the JVM exited, or it was
                not ready in time; the message holds the log tail and the log path.
        """
        if self.is_running:
            return self.bootstrap
        jars = fetch_jars(self._cache_dir)
        java = kp.require_tool("java")
        config = self._prepare(java, jars)
        started = time.monotonic()
        cmd = [*self._java(java, jars, self._heap_mb), "kafka.Kafka", str(config)]
        self._popen(cmd, detach)
        self._wait_until(self._answers_metadata, timeout_s)
        elapsed = time.monotonic() - started
        logger.info("Kafka ready at %s in %.1f s", self.bootstrap, elapsed)
        return self.bootstrap

    def _prepare(self, java: str, jars: Path) -> Path:
        """Write the config files, pick ports on first use, format fresh storage."""
        (self._workdir / "logs").mkdir(parents=True, exist_ok=True)
        config = self._workdir / "server.properties"
        data_dir = self._workdir / "data"
        formatted = (data_dir / "meta.properties").is_file()
        if self._ports is None and formatted and config.is_file():
            old = kp.parse_properties(config.read_text("utf-8"))
            self._ports = self._ports_from(old)
        if self._ports is None:
            self._ports = kp.pick_free_ports()
        rendered = kp.render_properties(self._server_properties(self._ports, data_dir))
        config.write_text(rendered, "utf-8")
        self._log4j.write_text(_resource_text("log4j2.properties"), "utf-8")
        if not formatted:
            self._format(java, jars, config)
        return config

    def _server_properties(
        self, ports: kp.BrokerPorts, data_dir: Path
    ) -> dict[str, str]:
        """The broker's ``server.properties`` (a subclass adds listeners, ACLs)."""
        return kp.server_properties(ports, data_dir)

    def _ports_from(self, props: dict[str, str]) -> kp.BrokerPorts:
        """The ports of an earlier start, read back from its properties."""
        return kp.ports_from_properties(props)

    def _format_args(self) -> list[str]:
        """More ``StorageTool format`` arguments (a subclass adds SCRAM users)."""
        return []

    def _client_config(self) -> dict[str, Any]:
        """librdkafka settings of the readiness check beyond the bootstrap."""
        return {}

    @property
    def _log4j(self) -> Path:
        return self._workdir / "log4j2.properties"

    def _java(self, java: str, jars: Path, heap_mb: int) -> list[str]:
        flags = kp.jvm_flags(heap_mb, self._workdir / "logs", self._log4j)
        return [java, *flags, "-cp", f"{jars}/*"]

    def _format(self, java: str, jars: Path, config: Path) -> None:
        cid = kp.new_cluster_id()
        tool = ["kafka.tools.StorageTool", "format", "-t", cid, "-c", str(config)]
        tool += self._format_args()
        logger.info("formatting KRaft storage in %s (cluster %s)", self._workdir, cid)
        with self.log_path.open("ab") as out:
            done = subprocess.run(
                [*self._java(java, jars, 256), *tool], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False,
            )  # fmt: skip
        if done.returncode != 0:
            raise self._failure(f"StorageTool format exited with {done.returncode}")

    def _answers_metadata(self) -> bool:
        if self._ports is None or not kp.tcp_open(kp.HOST, self._ports.client):
            return False
        if self._admin is None:
            config: dict[str, Any] = {
                "bootstrap.servers": self.bootstrap,
                "logger": client_logger(),
            }
            config |= self._client_config()
            self._admin = AdminClient(config)
        try:
            return len(self._admin.list_topics(timeout=2).brokers) >= 1
        except KafkaException:
            return False

    def _before_stop(self) -> None:
        self._admin = None  # first, so librdkafka does not retry a dying broker


@dataclass(frozen=True)
class BrokerSettings:
    """What ``mycroft broker`` needs (section ``broker`` of :mod:`mycroft.config`)."""

    dir: str = setting(
        "",
        "broker work folder",
        env=("MYCROFT_BROKER_DIR",),
        shown="$XDG_STATE_HOME/mycroft/broker",
        metavar="DIR",
    )
    heap_mb: int = setting(512, "JVM max heap, MiB", env=("MYCROFT_BROKER_HEAP_MB",))
    timeout: float = setting(120.0, "seconds to wait for the broker", metavar="S")
    secure: bool = setting(
        False,
        "SASL_SSL listener, SCRAM users and ACLs (infra/SECURITY.md); client "
        "security files in DIR/clients/",
    )
    topic_prefix: str = setting("", "with --secure: topic prefix of the ACLs")

    @property
    def path(self) -> Path:
        """The work folder, absolute."""
        return (Path(self.dir) if self.dir else state_dir() / "broker").resolve()


def _cmd_start(s: BrokerSettings) -> int:
    work = s.path
    state = kp.read_state(work)
    if kp.live_pid(state, work) is not None:
        print(state["bootstrap"])
        return 0
    work.mkdir(parents=True, exist_ok=True)
    secure = None
    if s.secure:
        from mycroft.infra.kafka_security import cli_broker  # noqa: PLC0415 (a cycle)

        secure = cli_broker(work, s.topic_prefix, s.heap_mb)
    broker = secure or KafkaBroker(work, heap_mb=s.heap_mb)
    bootstrap = broker.start(s.timeout, detach=True)
    log = str(broker.log_path)
    record: dict[str, object] = {
        "pid": broker.pid, "bootstrap": bootstrap, "log_path": log,
    }  # fmt: skip
    if secure is not None:
        secure.write_clients(work / "clients")
        record["clients"] = str(work / "clients")
    (work / kp.STATE_NAME).write_text(json.dumps(record, indent=2) + "\n", "utf-8")
    print(bootstrap)
    return 0


def _cmd_stop(s: BrokerSettings) -> int:
    work = s.path
    pid = kp.live_pid(kp.read_state(work), work)
    if pid is not None:
        kp.stop_pid(pid, work, s.timeout)
        logger.info("stopped Kafka broker pid %d", pid)
    (work / kp.STATE_NAME).unlink(missing_ok=True)
    return 0


def _cmd_status(s: BrokerSettings) -> int:
    state = kp.read_state(s.path)
    pid = kp.live_pid(state, s.path)
    rss = None if pid is None else kp.vmrss_bytes(pid)
    print(json.dumps({**state, "running": pid is not None, "rss_bytes": rss}, indent=2))
    return 0 if pid is not None else 1


def _cmd_fetch(s: BrokerSettings) -> int:
    print(fetch_jars())
    return 0


_COMMANDS = {
    "fetch": (_cmd_fetch, "resolve the broker's jars from Maven Central once", ()),
    "start": (
        _cmd_start,
        "start a broker left running (or print the running one's bootstrap)",
        ("dir", "heap_mb", "timeout", "secure", "topic_prefix"),
    ),
    "stop": (_cmd_stop, "stop the broker of the work folder", ("dir", "timeout")),
    "status": (_cmd_status, "print the broker's pid, bootstrap and memory", ("dir",)),
}


def _parser() -> argparse.ArgumentParser:
    parser = mycroft_parser(
        "broker",
        "Fetch, start, stop or inspect a local single-node Kafka broker (KRaft, "
        "Apache Kafka's jars from Maven Central) for trying Mycroft; production "
        "runs on the cluster's own Kafka.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, doc, only) in _COMMANDS.items():
        cmd = sub.add_parser(name, help=doc, description=doc[0].upper() + doc[1:] + ".")
        add_flags(cmd, BrokerSettings, "broker", only=only)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fetch``, ``start``, ``stop`` or ``status``; return the exit code."""
    flags = vars(_parser().parse_args(argv))
    settings = load(BrokerSettings, "broker", flags)
    setup_logging()
    try:
        return _COMMANDS[flags["command"]][0](settings)
    except MycroftError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
