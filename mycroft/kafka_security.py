"""Kafka client security shared by the agent, the stream worker and the sinks.

One :class:`KafkaSecurity` per process, built once in its entry point from
flags, then the environment, then a file (the flag wins), and rendered two
ways: librdkafka settings (confluent-kafka clients) and a TLS context plus
SASL credentials (the Faust worker, in ``streams/faust_auth.py``).

The password is a :class:`Secret`: its ``repr`` and ``str`` are masked, so
logging a settings object never prints it. It is never a flag either (a
command line is visible to every user of the host): it comes from
``--sasl-password-file``, the environment or the security file.
"""

from __future__ import annotations

import argparse
import json
import ssl
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mycroft.errors import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
MASK = "*****"

FLAGS: tuple[tuple[str, str], ...] = (
    ("security-protocol", "Kafka security protocol: " + " | ".join(PROTOCOLS)),
    ("sasl-mechanism", "SASL mechanism (default SCRAM-SHA-512)"),
    ("sasl-username", "SASL user name"),
    ("sasl-password-file", "file whose first line is the SASL password"),
    ("ssl-ca-file", "PEM file of the CA that signed the broker's certificate"),
    ("kafka-security-file", "TOML or JSON file with these settings (keys as flags)"),
)
"""The security flags, the same on every command that talks to Kafka."""

KEYS = tuple(name.replace("-", "_") for name, _ in FLAGS) + ("sasl_password",)
"""Keys of the file and suffixes of the environment variables."""


class Secret:
    """A string that does not show itself: ``repr`` and ``str`` are masked."""

    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself, for the client library and nothing else."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return f"Secret({MASK!r})" if self._value else "Secret('')"

    __str__ = __repr__


@dataclass(frozen=True)
class KafkaSecurity:
    """How a client authenticates to Kafka and checks the broker.

    Attributes:
        protocol: ``security.protocol``; PLAINTEXT (the default) needs nothing else.
        mechanism: SASL mechanism, SCRAM-SHA-512 unless told otherwise.
        username: SASL user (the Kafka principal ``User:<username>``).
        password: SASL password, masked in every ``repr``.
        ca_file: PEM CA bundle the broker's certificate is checked against;
            empty: the system's trust store.
    """

    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str = ""
    password: Secret = field(default_factory=Secret)
    ca_file: str = ""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"security protocol {self.protocol!r} is not one of "
                + ", ".join(PROTOCOLS)
            )
        if self.sasl:
            if self.mechanism not in MECHANISMS:
                raise ConfigError(
                    f"SASL mechanism {self.mechanism!r} is not one of "
                    + ", ".join(MECHANISMS)
                )
            if not self.username or not self.password:
                raise ConfigError(
                    f"security protocol {self.protocol} needs a SASL user name and "
                    "password (--sasl-username, --sasl-password-file)"
                )
        if self.ca_file and not Path(self.ca_file).is_file():
            raise ConfigError(f"CA file {self.ca_file!r} does not exist")

    @property
    def sasl(self) -> bool:
        """Whether the client authenticates with SASL."""
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        """Whether the connection is encrypted with TLS."""
        return self.protocol in {"SSL", "SASL_SSL"}

    def librdkafka(self) -> dict[str, Any]:
        """The confluent-kafka (librdkafka) settings; empty for PLAINTEXT."""
        if self.protocol == "PLAINTEXT":
            return {}
        out: dict[str, Any] = {"security.protocol": self.protocol}
        if self.sasl:
            out |= {
                "sasl.mechanisms": self.mechanism,
                "sasl.username": self.username,
                "sasl.password": self.password.reveal(),
            }
        if self.tls and self.ca_file:
            out["ssl.ca.location"] = self.ca_file
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context checking the broker (and its host name); None
        without TLS."""
        if not self.tls:
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file or None)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"CA file {self.ca_file!r} is not PEM: {exc}") from exc

    def redacted(self) -> dict[str, str]:
        """The settings for a log line, the password masked."""
        return {
            "protocol": self.protocol,
            "mechanism": self.mechanism if self.sasl else "",
            "username": self.username,
            "password": MASK if self.password else "",
            "ca_file": self.ca_file,
        }

    def to_flags(self) -> list[str]:
        """Flags that :func:`security_from` reads back, without the password."""
        if self.protocol == "PLAINTEXT":
            return []
        argv = ["--security-protocol", self.protocol]
        if self.sasl:
            argv += ["--sasl-mechanism", self.mechanism]
            argv += ["--sasl-username", self.username]
        if self.ca_file:
            argv += ["--ssl-ca-file", self.ca_file]
        return argv


PLAINTEXT = KafkaSecurity()
"""No TLS, no authentication: what every command uses unless told otherwise."""


def env_prefixes(section: str) -> tuple[str, ...]:
    """The prefixes of the security variables of a command whose settings
    are ``section`` (its name: ``sinks``, ``streams``), in the order they are
    read: ``MYCROFT_<SECTION>__``, the form of every other setting, then
    ``MYCROFT_``, shared by every command."""
    return (f"MYCROFT_{section.upper()}__", "MYCROFT_") if section else ("MYCROFT_",)


def _prefixes(env_prefix: str | Sequence[str]) -> tuple[str, ...]:
    return (env_prefix,) if isinstance(env_prefix, str) else tuple(env_prefix)


def add_flags(parser: argparse.ArgumentParser, env_prefix: str | Sequence[str]) -> None:
    """Add the security flags of :data:`FLAGS`, each naming its variables."""
    prefixes = _prefixes(env_prefix)
    group = parser.add_argument_group(
        "Kafka security",
        f"each flag has a {prefixes[0]}<NAME> variable"
        + (f" (or {prefixes[1]}<NAME>, shared by every command)"
           if len(prefixes) > 1 else "")
        + f"; the password comes from --sasl-password-file, {prefixes[0]}"
        "SASL_PASSWORD or the security file, never from a flag",
    )  # fmt: skip
    for name, doc in FLAGS:
        var = prefixes[0] + name.replace("-", "_").upper()
        group.add_argument(f"--{name}", default=None, help=f"{doc} (env {var})")


def read_file(path: Path) -> dict[str, str]:
    """Read a security file: TOML (``.toml``) or JSON, optionally under a
    ``[kafka_security]`` table; keys are those of :data:`KEYS`.

    Raises:
        ConfigError: unreadable, not a table, or an unknown key.
    """
    try:
        text = path.read_text("utf-8")
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read security file {path}: {exc}") from exc
    table = data.get("kafka_security", data) if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ConfigError(f"security file {path}: expected a table of settings")
    unknown = sorted(set(table) - set(KEYS) - {"kafka_security_file"})
    if unknown:
        raise ConfigError(f"security file {path}: unknown keys {', '.join(unknown)}")
    return {str(k): str(v) for k, v in table.items()}


def _password_file(path: str) -> str:
    try:
        lines = Path(path).read_text("utf-8").splitlines()
    except OSError as exc:  # the path is not shown: it may be a mistyped password
        raise ConfigError(
            f"cannot read the SASL password file: {exc.strerror or exc}"
        ) from None
    if not lines or not lines[0]:
        raise ConfigError("the SASL password file is empty")
    return lines[0]


def _layer(values: Mapping[str, str | None]) -> dict[str, str]:
    """Non-empty values, a password file replaced by the password it holds."""
    out = {k: v for k, v in values.items() if k in KEYS and v}
    if path := out.pop("sasl_password_file", ""):
        out["sasl_password"] = _password_file(path)
    return out


def split_security(table: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """Split a config-file table into its security keys (of :data:`KEYS`, as
    text, for :func:`security_from`) and the command's other settings."""
    security = {k: str(v) for k, v in table.items() if k in KEYS}
    return security, {k: v for k, v in table.items() if k not in KEYS}


def security_from(
    flags: Mapping[str, str | None],
    env: Mapping[str, str],
    env_prefix: str | Sequence[str],
    file_values: Mapping[str, str] | None = None,
) -> KafkaSecurity:
    """Merge the file < the environment < the flags into one :class:`KafkaSecurity`.

    Args:
        flags: parsed flags by key of :data:`KEYS` (None: not given).
        env: the environment; ``<env_prefix><KEY>`` variables are read.
        env_prefix: the prefix of the variables, or prefixes in the order
            they are read (the first that sets a key wins): a command's
            :func:`env_prefixes`.
        file_values: settings from a file the command already reads (the
            agent's ``--config``); a ``kafka_security_file`` is read too.

    Raises:
        ConfigError: a file is unreadable or the merged settings are invalid.
    """
    prefixes = _prefixes(env_prefix)
    env_values = {
        key: next((env[p + key.upper()] for p in prefixes if p + key.upper() in env),
                  None)
        for key in KEYS
    }  # fmt: skip
    path = flags.get("kafka_security_file") or env_values.get("kafka_security_file")
    if not path and file_values:
        path = file_values.get("kafka_security_file")
    merged: dict[str, str] = {}
    for layer in (
        file_values or {},
        read_file(Path(path)) if path else {},
        env_values,
        flags,
    ):
        merged |= _layer(layer)
    return KafkaSecurity(
        protocol=merged.get("security_protocol", "PLAINTEXT").upper(),
        mechanism=merged.get("sasl_mechanism", "SCRAM-SHA-512").upper(),
        username=merged.get("sasl_username", ""),
        password=Secret(merged.get("sasl_password", "")),
        ca_file=merged.get("ssl_ca_file", ""),
    )


def security_from_argv(
    argv: Sequence[str], env: Mapping[str, str], env_prefix: str | Sequence[str]
) -> KafkaSecurity:
    """:func:`security_from` for a command line of which only the security
    flags matter (checks made before the command parses its own)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_flags(parser, env_prefix)
    known, _ = parser.parse_known_args(list(argv))
    return security_from(vars(known), env, env_prefix)
