"""Helpers of :mod:`mycroft.infra.kafka_broker`.

The first half is pure (ports, cluster ids, ``server.properties``, JVM flags) and
is unit-tested without Java; the second half wraps the OS: Maven, locks, signals.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from mycroft.errors import BrokerError, ConfigError
from mycroft.kafka_logging import client_logger

HOST = "127.0.0.1"
"""Every listener binds here: ``localhost`` may resolve to ``::1`` first and detour."""

NODE_ID = 1
MIN_HEAP_MB = 128
MARKER_NAME = "jars.txt"
STATE_NAME = "broker.json"


@dataclass(frozen=True)
class BrokerPorts:
    """The two TCP ports of a single-node broker.

    Attributes:
        client: the PLAINTEXT listener that clients bootstrap from.
        controller: the KRaft CONTROLLER listener.
    """

    client: int
    controller: int


def pick_free_ports(host: str = HOST) -> BrokerPorts:
    """Return two distinct ports that were free on ``host`` a moment ago.

    Both sockets are bound at the same time so the kernel cannot hand out one
    port twice; another process may still take one before the broker binds it.
    """
    with socket.socket() as first, socket.socket() as second:
        first.bind((host, 0))
        second.bind((host, 0))
        return BrokerPorts(first.getsockname()[1], second.getsockname()[1])


def new_cluster_id(make_uuid: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """Return a KRaft cluster id like ``kafka-storage random-uuid`` prints.

    The id is the URL-safe base64 of 16 random bytes without ``=`` padding
    (22 characters). Ids starting with ``-`` are redrawn, as Kafka's
    ``Uuid.randomUuid`` does, because the command line would read them as flags.
    """
    while True:
        text = base64.urlsafe_b64encode(make_uuid().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


def server_properties(
    ports: BrokerPorts, data_dir: Path, *, host: str = HOST
) -> dict[str, str]:
    """Return the settings of a single-node combined broker and controller.

    Everything internal gets replication factor 1 and one partition so groups
    and transactions work on one node at once; thread counts and the log
    cleaner's dedupe buffer are sized for 2 cores and a 512 MiB heap. The
    quorum is static (``controller.quorum.voters``), so a data folder is not
    tied to the controller port it was formatted with.
    """
    listeners = (
        f"PLAINTEXT://{host}:{ports.client},CONTROLLER://{host}:{ports.controller}"
    )
    return {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@{host}:{ports.controller}",
        "listeners": listeners,
        "advertised.listeners": listeners,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.enable": "true",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
    }


def render_properties(props: Mapping[str, str]) -> str:
    """Render ``key=value`` lines in the given order, ending with a newline."""
    for key, value in props.items():
        if "\n" in key or "\n" in value or "=" in key:
            raise ConfigError(
                f"property {key!r} cannot be written to a .properties file"
            )
    header = "# Written by mycroft.infra.kafka_broker; edits are lost on restart.\n"
    return header + "".join(f"{key}={value}\n" for key, value in props.items())


def parse_properties(text: str) -> dict[str, str]:
    """Parse the simple ``key=value`` files that :func:`render_properties` writes."""
    props: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


def ports_from_properties(props: Mapping[str, str]) -> BrokerPorts:
    """Read the client and controller ports back from ``listeners``.

    Raises:
        ConfigError: ``listeners`` lacks a PLAINTEXT or CONTROLLER entry; delete
            the work folder to let the launcher write a fresh one.
    """
    found: dict[str, int] = {}
    for entry in props.get("listeners", "").split(","):
        name, sep, address = entry.strip().partition("://")
        if sep and address.rpartition(":")[2].isdigit():
            found[name] = int(address.rpartition(":")[2])
    if "PLAINTEXT" not in found or "CONTROLLER" not in found:
        raise ConfigError(
            f"listeners={props.get('listeners')!r} lacks PLAINTEXT or CONTROLLER; "
            "delete the broker work folder to start from scratch"
        )
    return BrokerPorts(found["PLAINTEXT"], found["CONTROLLER"])


def jvm_flags(heap_mb: int, logs_dir: Path, log4j_config: Path) -> list[str]:
    """Return JVM flags for a small, fast-starting test broker.

    Serial GC and C1-only compilation start faster and use fewer threads on
    2 cores; remote JMX and GC logging of ``kafka-run-class.sh`` are left out.

    Raises:
        ConfigError: ``heap_mb`` is below :data:`MIN_HEAP_MB`.
    """
    if heap_mb < MIN_HEAP_MB:
        raise ConfigError(f"heap_mb={heap_mb} is too small; use at least {MIN_HEAP_MB}")
    return [
        f"-Xms{min(256, heap_mb)}m",
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        "-Djava.net.preferIPv4Stack=true",
        f"-Dkafka.logs.dir={logs_dir}",
        f"-Dlog4j2.configurationFile={log4j_config}",
    ]


def tail_lines(path: Path, count: int = 40) -> str:
    """Return the last ``count`` lines of a log file, or a note when it is missing."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            data = handle.read()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    lines = data.decode("utf-8", "replace").splitlines()[-count:]
    return "\n".join(lines)


# --- OS helpers -------------------------------------------------------------------


def require_tool(tool: str) -> str:
    """Return the path of ``tool`` on PATH, or raise a BrokerError saying what to do."""
    found = shutil.which(tool)
    if found is None:
        raise BrokerError(
            f"{tool!r} is not on PATH; install it (apt-get install maven "
            "openjdk-17-jre-headless) or point MYCROFT_TEST_BROKER at a running broker"
        )
    return found


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (parallel sessions fetch once)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def jars_ready(cache: Path, digest: str) -> bool:
    """Whether the marker lists jars resolved from the pom with this sha256."""
    try:
        lines = (cache / MARKER_NAME).read_text("utf-8").splitlines()
    except OSError:
        return False
    jars = lines[1:]
    header_ok = lines[:1] == [f"pom-sha256 {digest}"]
    return header_ok and bool(jars) and all((cache / jar).is_file() for jar in jars)


def write_marker(cache: Path, digest: str) -> list[str]:
    """List the jars in ``cache`` in the marker file (atomically) and return them."""
    jars = sorted(jar.name for jar in cache.glob("*.jar"))
    if not any(jar.startswith("kafka_2.13-") for jar in jars):
        raise BrokerError(f"mvn copied no kafka_2.13 jar; see {cache / 'mvn.log'}")
    tmp = cache / f"{MARKER_NAME}.tmp"
    tmp.write_text("\n".join([f"pom-sha256 {digest}", *jars]) + "\n", "utf-8")
    tmp.replace(cache / MARKER_NAME)
    return jars


def run_mvn(cache: Path, pom: str, timeout_s: float = 900.0) -> None:
    """Copy the runtime dependencies of ``pom`` into ``cache`` (log: ``mvn.log``)."""
    mvn = require_tool("mvn")
    require_tool("java")
    for stale in cache.glob("*.jar"):  # a changed pom must not leave old jars behind
        stale.unlink()
    (cache / "pom.xml").write_text(pom, "utf-8")
    log = cache / "mvn.log"
    goal = ["dependency:copy-dependencies", "-DincludeScope=runtime"]
    cmd = [mvn, "-B", "-q", "-f", str(cache / "pom.xml"), *goal]
    cmd.append(f"-DoutputDirectory={cache}")
    try:
        with log.open("wb") as out:
            done = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=cache, timeout=timeout_s, check=False,
            )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(f"mvn ran over {timeout_s:.0f} s; see {log}") from exc
    if done.returncode != 0:
        raise BrokerError(
            f"mvn failed with exit code {done.returncode}; check access to Maven "
            f"Central, then see {log}:\n{tail_lines(log)}"
        )


def tcp_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def check_bootstrap(
    bootstrap: str, timeout_s: float = 5.0, extra: Mapping[str, Any] | None = None
) -> None:
    """Check that the broker at ``host:port[,...]`` answers a metadata request.

    ``extra``: more librdkafka settings of the check (TLS, SASL).

    Raises:
        BrokerError: nothing listens there or no broker answered in time.
    """
    host, _, port = bootstrap.split(",", maxsplit=1)[0].strip().rpartition(":")
    if not port.isdigit() or not tcp_open(host.strip("[]"), int(port), timeout_s):
        raise BrokerError(
            f"nothing accepts connections at {bootstrap!r}; start a broker"
        )
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": client_logger()}
    config |= dict(extra or {})
    admin = AdminClient(config)
    try:
        brokers = admin.list_topics(timeout=timeout_s).brokers
    except KafkaException as exc:
        raise BrokerError(f"{bootstrap!r} gave no Kafka metadata: {exc}") from exc
    if not brokers:
        raise BrokerError(f"{bootstrap!r} answered metadata without any broker")


def terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM (Kafka's controlled shutdown), then SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def vmrss_bytes(pid: int) -> int | None:
    """Return the resident set size of ``pid`` from ``/proc``, None if unknown."""
    try:
        status = Path(f"/proc/{pid}/status").read_text("ascii")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def is_broker_of(pid: int, workdir: Path) -> bool:
    """Whether ``pid`` is a live ``kafka.Kafka`` JVM using ``workdir`` (pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline and str(workdir.resolve()).encode() in cmdline


def stop_pid(pid: int, workdir: Path, timeout_s: float) -> None:
    """Stop a broker that is not our child: SIGTERM, poll, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_broker_of(pid, workdir):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.1)


@dataclass
class Runtime:
    """What the finalizer needs; kept apart so the broker object can be collected."""

    proc: subprocess.Popen[bytes] | None = None
    detached: bool = False
    owned_dir: Path | None = None


def reap(runtime: Runtime) -> None:
    """Stop an attached broker and delete an owned work folder (finalizer)."""
    if runtime.proc is not None and not runtime.detached:
        terminate(runtime.proc, 10.0)
    runtime.proc = None
    if runtime.owned_dir is not None:
        shutil.rmtree(runtime.owned_dir, ignore_errors=True)
        runtime.owned_dir = None


def read_state(directory: Path, name: str = STATE_NAME) -> dict[str, object]:
    """Read a service CLI's state file (``broker.json``); empty when absent."""
    try:
        loaded = json.loads((directory / name).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def live_pid(state: Mapping[str, object], directory: Path) -> int | None:
    """Return the recorded pid if it is still the broker of ``directory``."""
    pid = state.get("pid")
    return pid if isinstance(pid, int) and is_broker_of(pid, directory) else None
