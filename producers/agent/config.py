"""Agent settings: config file < ``MYCROFT_*`` environment < command-line flags.

Built once in ``main`` by :func:`mycroft.config.load` and passed down
frozen. Kafka client settings (``kafka`` table in the file,
``MYCROFT_KAFKA__SASL_PASSWORD``-style variables, ``--kafka-option
sasl.password=...`` flags) are handed to librdkafka unchanged; any whose
name looks secret is masked by :func:`masked`.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mycroft.config import setting
from mycroft.errors import ConfigError
from mycroft.kafka_security import PLAINTEXT, KafkaSecurity
from mycroft.logs import LEVELS

SOURCES = ("ring", "sim", "replay")
KAFKA_ENV = "MYCROFT_KAFKA__"
_SECRET_WORDS = ("password", "secret", "token", "credential", "jaas", "pem", "key.pem")
MASK = "*****"


def _s(default: Any, doc: str, **kw: Any) -> Any:
    """An agent setting, also read from the older ``MYCROFT_<FIELD>`` name."""
    return setting(default, doc, env=("MYCROFT_*",), **kw)


@dataclass(frozen=True)
class Settings:
    """Everything the agent needs; see ``producers/agent/README.md`` for each field.

    Each field is a setting of :mod:`mycroft.config` (section ``agent``): a
    flag, ``MYCROFT_AGENT__<FIELD>`` or the older ``MYCROFT_<FIELD>``, a key
    of the config file; ``kafka`` and ``security`` are built apart.
    """

    job_id: str = _s("default", "training job id (Kafka key)")
    host: str = _s("", "host name stamped on batches", shown="the hostname")
    source: str = _s("ring", "where records come from: ring, sim or replay")
    ring_dir: str = _s("/dev/shm/mycroft", "folder of ring files")  # noqa: S108 - the ring folder, by design
    ring_glob: str = _s("*.ring", "ring file pattern")
    replay_file: str = _s("", "trace file for --source replay", shown="none")
    replay_speed: float = _s(0.0, "replay pace, 1.0 = real time, 0 = at once")
    sim_args: str = _s("", "mycroft simulate arguments for --source sim (no --out)")
    sim_start_s: float = _s(0.0, "simulated job start, Unix s (0: aligned to 10 s)")
    interval_ms: int = _s(100, "sampling tick, ms")
    heartbeat_s: float = _s(1.0, "heartbeat period, s")
    nic_sysfs: str = _s(
        "/sys/class/infiniband", "RDMA sysfs folder for NIC port state ('': off)"
    )
    bootstrap: str = _s(
        "", "Kafka bootstrap servers", shown="none", metavar="HOST:PORT"
    )
    topic_prefix: str = _s("", "topic name prefix (tests, tenants)")
    partitions: int = _s(0, "override every topic's partition count (0: per topic)")
    spool_dir: str = _s("/var/lib/mycroft-agent/spool", "disk spool folder")
    spool_max_bytes: int = _s(256 << 20, "spool bound, bytes")
    spool_segment_bytes: int = _s(8 << 20, "spool segment size, bytes")
    spool_fsync_s: float = _s(
        1.0, "fsync the spool at most this often, s (0: every tick)"
    )
    delivery_timeout_ms: int = _s(120_000, "librdkafka message.timeout.ms")
    retry_s: float = _s(1.0, "probe period while Kafka is unreachable, s")
    shutdown_flush_s: float = _s(
        10.0, "how long SIGTERM waits for deliveries (Ctrl-C: 1 s at most), s"
    )
    metrics_port: int = _s(0, "Prometheus port (0: off)")
    metrics_addr: str = _s(
        "127.0.0.1", "Prometheus listen address (0.0.0.0: scraped from other hosts)"
    )
    duration_s: float = _s(0.0, "stop after this long (0: run until SIGTERM)")
    log_level: str = _s("INFO", "DEBUG, INFO, WARNING or ERROR")
    kafka: Mapping[str, str] = field(default_factory=dict)
    security: KafkaSecurity = PLAINTEXT

    def __post_init__(self) -> None:
        if not self.host:  # resolved once, so the logged settings show it
            object.__setattr__(self, "host", socket.gethostname())
        _validate(self)

    def kafka_config(self) -> dict[str, Any]:
        """librdkafka settings beyond ``producer_config`` (security, timeouts)."""
        timeout = {"message.timeout.ms": self.delivery_timeout_ms}
        return self.security.librdkafka() | timeout | dict(self.kafka)

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict with every secret masked (for logs)."""
        out = dataclasses.asdict(dataclasses.replace(self, security=PLAINTEXT))
        out["kafka"] = masked(self.kafka)
        out["security"] = self.security.redacted()
        return out


def is_secret(name: str) -> bool:
    """Whether a librdkafka setting holds a secret (passwords, keys, tokens)."""
    low = name.lower()
    return any(w in low for w in _SECRET_WORDS) or low in {"ssl.key.location.pem"}


def masked(kafka: Mapping[str, str]) -> dict[str, str]:
    """Copy of ``kafka`` with secret values replaced by ``*****``."""
    return {k: (MASK if is_secret(k) else v) for k, v in kafka.items()}


def read_file(path: Path) -> dict[str, Any]:
    """Read a TOML (``.toml``) or JSON file; an ``[agent]`` table is unwrapped."""
    try:
        text = path.read_text("utf-8")
        data: dict[str, Any] = (
            tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    agent = data.get("agent", data)
    if not isinstance(agent, dict):
        raise ConfigError(f"{path}: [agent] must be a table")
    return agent


def kafka_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings of ``MYCROFT_KAFKA__<PROP_WITH_UNDERSCORES>`` variables."""
    return {
        var.removeprefix(KAFKA_ENV).lower().replace("_", "."): value
        for var, value in env.items()
        if var.startswith(KAFKA_ENV)
    }


def _validate(s: Settings) -> None:
    if s.source not in SOURCES:
        raise ConfigError(f"source={s.source!r} is not one of {', '.join(SOURCES)}")
    if s.interval_ms <= 0 or s.heartbeat_s <= 0:
        raise ConfigError("interval_ms and heartbeat_s must be positive")
    if s.source == "replay" and not s.replay_file:
        raise ConfigError("source=replay needs replay_file (--replay-file)")
    if s.source == "sim" and "--truth" not in s.sim_args:
        raise ConfigError(
            "source=sim needs sim_args with at least --ranks and --truth, e.g. "
            "--sim-args '--ranks 64 --pp 2 --dp 4 --fault nic-down --truth t.json'"
        )
    if s.log_level.upper() not in LEVELS:
        raise ConfigError(
            f"log_level={s.log_level!r} is not one of {', '.join(LEVELS)}"
        )
    if s.spool_max_bytes < 2 * s.spool_segment_bytes:
        raise ConfigError("spool_max_bytes must be at least 2 x spool_segment_bytes")
    if not s.job_id:
        raise ConfigError("job_id must not be empty")
