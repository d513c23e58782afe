"""Agent settings: config file < ``MYCROFT_*`` environment < command-line flags.

Built once in ``main`` and passed down frozen. Kafka client settings
(``kafka`` table in the file, ``MYCROFT_KAFKA__SASL_PASSWORD``-style
variables, ``--kafka-option sasl.password=...`` flags) are handed to
librdkafka unchanged; any whose name looks secret is masked by :func:`masked`.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mycroft.errors import ConfigError
from mycroft.kafka_security import PLAINTEXT, KafkaSecurity

SOURCES = ("ring", "sim", "replay")
_SECRET_WORDS = ("password", "secret", "token", "credential", "jaas", "pem", "key.pem")
MASK = "*****"


@dataclass(frozen=True)
class Settings:
    """Everything the agent needs; see ``producers/agent/README.md`` for each field."""

    job_id: str = "default"
    host: str = field(default_factory=socket.gethostname)
    source: str = "ring"
    ring_dir: str = "/dev/shm/mycroft"  # noqa: S108 - the ring folder, by design
    ring_glob: str = "*.ring"
    replay_file: str = ""
    replay_speed: float = 0.0
    sim_args: str = ""
    sim_start_s: float = 0.0
    interval_ms: int = 100
    heartbeat_s: float = 1.0
    nic_sysfs: str = "/sys/class/infiniband"
    bootstrap: str = ""
    topic_prefix: str = ""
    partitions: int = 0
    spool_dir: str = "/var/lib/mycroft-agent/spool"
    spool_max_bytes: int = 256 << 20
    spool_segment_bytes: int = 8 << 20
    spool_fsync_s: float = 1.0
    delivery_timeout_ms: int = 120_000
    retry_s: float = 1.0
    shutdown_flush_s: float = 10.0
    metrics_port: int = 0
    metrics_addr: str = "0.0.0.0"  # noqa: S104 - a node exporter listens on the node
    duration_s: float = 0.0
    log_level: str = "INFO"
    kafka: Mapping[str, str] = field(default_factory=dict)
    security: KafkaSecurity = PLAINTEXT

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


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``MYCROFT_<FIELD>`` and ``MYCROFT_KAFKA__<PROP_WITH_UNDERSCORES>`` variables."""
    names = {f.name for f in fields(Settings)} - {"kafka", "security"}
    out: dict[str, Any] = {}
    kafka: dict[str, str] = {}
    for var, value in env.items():
        if var.startswith("MYCROFT_KAFKA__"):
            kafka[var.removeprefix("MYCROFT_KAFKA__").lower().replace("_", ".")] = value
        elif var.startswith("MYCROFT_") and var[8:].lower() in names:
            out[var[8:].lower()] = value
    if kafka:
        out["kafka"] = kafka
    return out


def build(
    file_values: Mapping[str, Any],
    env_values: Mapping[str, Any],
    flag_values: Mapping[str, Any],
) -> Settings:
    """Merge the three layers (later wins; ``kafka`` merges key by key) and validate.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or a bad value.
    """
    types = {f.name: f for f in fields(Settings)}
    merged: dict[str, Any] = {}
    kafka: dict[str, str] = {}
    for layer in (file_values, env_values, flag_values):
        for raw_key, value in layer.items():
            key = raw_key.replace("-", "_")
            if key not in types:
                raise ConfigError(f"unknown agent setting {key!r}")
            if key == "kafka":
                kafka |= {str(k): str(v) for k, v in dict(value).items()}
            elif value is not None:
                merged[key] = _coerce(key, value, types[key].type)
    settings = Settings(**merged, kafka=kafka)
    _validate(settings)
    return settings


def _coerce(key: str, value: Any, typ: Any) -> Any:
    target = {"int": int, "float": float, "str": str}.get(str(typ), str)
    try:
        return target(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r} is not a valid {target.__name__}") from None


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
    if s.spool_max_bytes < 2 * s.spool_segment_bytes:
        raise ConfigError("spool_max_bytes must be at least 2 x spool_segment_bytes")
    if not s.job_id:
        raise ConfigError("job_id must not be empty")
