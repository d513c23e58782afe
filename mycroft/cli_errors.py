"""The ``mycroft`` command's one error path: exit codes and what a failure says.

Every expected failure of a subcommand ends here: :func:`explain` turns the
exception into one line saying what is wrong and, where there is one, a
second line saying what to do, with the exit code of its class
(:class:`ExitCode`, documented in the README). Connection failures name the
address and the flag or environment variable that set it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import gzip
import json
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from mycroft.errors import (
    BrokerError,
    ConfigError,
    DecodeError,
    InputError,
    KafkaRefused,
    MycroftError,
    Refusal,
    SchemaError,
    SinkError,
)
from mycroft.kafka_diagnosis import refused_exception


class ExitCode(IntEnum):
    """Exit codes of every ``mycroft`` command."""

    OK = 0
    FAILED = 1  # it ran and failed; or an unexpected error (see --debug)
    USAGE = 2  # unknown command, bad or missing flag, flags that do not combine
    ROOT_CAUSE = 3  # mycroft analyze: a root cause names a culprit
    INPUT = 4  # a path missing or unusable, a file not what the command reads
    UNAVAILABLE = 5  # Kafka, Prometheus or OpenSearch cannot be reached
    MISSING_EXTRA = 6  # an optional dependency is not installed
    AUTHENTICATION = 7  # Kafka refused the SASL user, password or mechanism
    TLS = 8  # TLS with Kafka failed: CA not trusted, TLS on one side only
    AUTHORIZATION = 9  # Kafka's ACLs refuse this user a topic, group or cluster
    INTERRUPTED = 130  # Ctrl-C


EXTRAS = {
    "faust": "streams",
    "mode": "streams",
    "aiokafka": "streams",
    "cramjam": "streams",
    "networkx": "streams",
    "scipy": "streams",
    "torch": "torch",
    "matplotlib": "report",
    "pyinstrument": "bench",
    "tabulate": "bench",
    "testcontainers": "docker",
    "docker": "docker",
}
"""Top-level module -> the extra of ``mycroft-trace`` that installs it."""

BROKER_SETTINGS: dict[str, tuple[str, str, str, str | None]] = {
    "topics": ("--bootstrap", "topics", "bootstrap", "MYCROFT_BOOTSTRAP"),
    "incidents": ("--bootstrap", "incidents", "bootstrap", "MYCROFT_BOOTSTRAP"),
    "sinks": ("--bootstrap", "sinks", "bootstrap", "MYCROFT_BOOTSTRAP"),
    "streams": ("--bootstrap", "streams", "bootstrap", "MYCROFT_BOOTSTRAP"),
    "replay": ("--bootstrap", "replay", "bootstrap", "MYCROFT_BOOTSTRAP"),
    "simulate": ("--bootstrap", "", "", None),
    "demo": ("--bootstrap", "", "", None),
    "agent": ("--bootstrap", "agent", "bootstrap", "MYCROFT_BOOTSTRAP"),
}
"""Command -> where its Kafka address comes from, in :mod:`mycroft.config`'s
order: the flag, ``MYCROFT_<SECTION>__<FIELD>``, an older variable, the
``[section]`` table's field in the config file ('': flag only)."""
OPENSEARCH_FLAG = "--opensearch-url"
LISTEN_FLAG = "--prometheus-listen"
_DATA_ERRORS = (
    gzip.BadGzipFile,
    EOFError,
    zlib.error,
    UnicodeDecodeError,
    json.JSONDecodeError,
)


@dataclass(frozen=True)
class Failure:
    """What the command prints and returns."""

    code: ExitCode
    message: str
    hint: str = ""
    debug: str = ""  # the client library's own words, shown with --debug

    def lines(self, command: str) -> list[str]:
        """``mycroft COMMAND: message`` and the hint, if any."""
        head = (
            f"mycroft {command}: {self.message}"
            if command
            else f"mycroft: {self.message}"
        )
        return [head] + ([f"  {self.hint}"] if self.hint else [])


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``), last wins."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def broker_setting(command: str, argv: Sequence[str]) -> tuple[str | None, str]:
    """``(address, what set it)`` of the Kafka ``command argv`` is pointed at,
    or ``(None, the settings that would)``."""
    flag, section, field, older = BROKER_SETTINGS.get(
        command, ("--bootstrap", "", "", "MYCROFT_BOOTSTRAP")
    )
    if (value := flag_value(argv, flag)) is not None:
        return value, flag
    if (value := flag_value(argv, "--kafka")) is not None:
        return value, "--kafka"  # replay's and simulate's older name of --bootstrap
    own = f"MYCROFT_{section.upper()}__{field.upper()}" if section else None
    for var in (own, older):
        if var and (value := os.environ.get(var)):
            return value, var
    if section and (found := _from_config_file(argv, section, field)):
        return found
    names = " / ".join(n for n in (flag, own, older) if n)
    return None, names


def _from_config_file(
    argv: Sequence[str], section: str, field: str
) -> tuple[str, str] | None:
    """``(value, where)`` of ``field`` in the config file's ``[section]``, if set;
    a file that cannot be read is the command's to report."""
    from mycroft.config import CONFIG_ENV, read_section  # noqa: PLC0415

    given = flag_value(argv, "--config") or os.environ.get(CONFIG_ENV)
    if not given:
        return None
    path = Path(given).expanduser()
    try:
        value = read_section(path, section).get(field)
    except MycroftError:
        return None
    return (str(value), f"{field} in [{section}] of {path}") if value else None


def _unreachable_kafka(
    exc: BaseException, command: str, argv: Sequence[str]
) -> Failure:
    address, setting = broker_setting(command, argv)
    where = f"Kafka at {address}" if address else "Kafka"
    detail = str(exc) or type(exc).__name__
    if address and address in detail:
        detail = ""  # the message already names it
    return Failure(
        ExitCode.UNAVAILABLE,
        f"cannot reach {where}" + (f": {detail}" if detail else ""),
        f"start a broker (mycroft broker start) or point {setting} at a running one",
    )


def _os_failure(exc: OSError, command: str, argv: Sequence[str]) -> Failure:
    if exc.errno == errno.EADDRINUSE:
        listen = flag_value(argv, LISTEN_FLAG) or "the address"
        return Failure(
            ExitCode.UNAVAILABLE,
            f"cannot listen on {listen}: address already in use",
            f"choose another {LISTEN_FLAG} HOST:PORT, or stop what holds it",
        )
    if isinstance(exc, ConnectionError):
        return _unreachable_kafka(exc, command, argv)
    name = exc.filename if exc.filename is not None else "a path"
    what = exc.strerror or str(exc)
    return Failure(
        ExitCode.INPUT, f"{name}: {what}", "check the path and its permissions"
    )


def _missing(exc: ModuleNotFoundError) -> Failure:
    module = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return Failure(
            ExitCode.MISSING_EXTRA,
            f"the Python module {module or exc.name!r} is not installed",
            "reinstall: pip install mycroft-trace",
        )
    return Failure(
        ExitCode.MISSING_EXTRA,
        f"this needs {module}, which comes with the '{extra}' extra",
        f"install it: pip install 'mycroft-trace[{extra}]'",
    )


def _sink_failure(exc: SinkError, argv: Sequence[str]) -> Failure:
    url = flag_value(argv, OPENSEARCH_FLAG) or os.environ.get(
        "MYCROFT_SINKS__OPENSEARCH_URL"
    )
    hint = f"check that OpenSearch answers at {url}, or change {OPENSEARCH_FLAG}"
    return Failure(ExitCode.UNAVAILABLE, str(exc), hint if url else "")


def _broker_failure(exc: BaseException, command: str, argv: Sequence[str]) -> Failure:
    if command == "broker":
        return Failure(ExitCode.UNAVAILABLE, str(exc), "see mycroft broker --help")
    return _unreachable_kafka(exc, command, argv)


def _data_failure(exc: BaseException, _command: str, argv: Sequence[str]) -> Failure:
    files = [a for a in argv if not a.startswith("-") and os.path.isfile(a)]
    what = files[0] if len(files) == 1 else "an input file"
    return Failure(
        ExitCode.INPUT,
        f"cannot read {what}: {exc}",
        "check that the file is complete and of the kind the command reads",
    )


_Rule = tuple[
    type[BaseException] | tuple[type[BaseException], ...],
    Callable[[Any, str, Sequence[str]], Failure],
]
_RULES: list[_Rule] = [
    (KeyboardInterrupt, lambda e, c, a: Failure(ExitCode.INTERRUPTED, "interrupted")),
    (ModuleNotFoundError, lambda e, c, a: _missing(e)),
    ((InputError, DecodeError, SchemaError),
     lambda e, c, a: Failure(ExitCode.INPUT, str(e))),
    (ConfigError,
     lambda e, c, a: Failure(ExitCode.USAGE, str(e), f"see 'mycroft {c} --help'")),
    (SinkError, lambda e, c, a: _sink_failure(e, a)),
    ((BrokerError, KafkaException, TimeoutError, concurrent.futures.TimeoutError),
     _broker_failure),
    (_DATA_ERRORS, _data_failure),
    (OSError, _os_failure),
    (MycroftError, lambda e, c, a: Failure(ExitCode.FAILED, str(e))),
]  # fmt: skip
"""Exception class -> its failure, first match wins (order matters: an
``InputError`` is a ``ConfigError``, a ``TimeoutError`` and a ``BadGzipFile``
are ``OSError``)."""


def _client_security(command: str, argv: Sequence[str]) -> Any:
    """The command's Kafka security settings, None when they do not parse."""
    from mycroft.kafka_security import env_prefixes, security_from_argv  # noqa: PLC0415

    section = "" if command == "agent" else command  # the agent: MYCROFT_<KEY>
    try:
        return security_from_argv(argv, os.environ, env_prefixes(section))
    except MycroftError:
        return None


def refusal_failure(exc: KafkaRefused, command: str, argv: Sequence[str]) -> Failure:
    """What to say when the broker answered and turned the command away."""
    address, _ = broker_setting(command, argv)
    where = f"Kafka at {address}" if address else "Kafka"
    sec = _client_security(command, argv)
    named = sec is not None and sec.username
    user = f"user {sec.username!r}" if named else "this client"
    debug = f"librdkafka: {exc.code}: {exc.detail}"
    if exc.refusal is Refusal.AUTHENTICATION:
        mechanism = f" ({sec.mechanism})" if sec is not None and sec.sasl else ""
        return Failure(
            ExitCode.AUTHENTICATION,
            f"{where} refused the SASL login of {user}{mechanism}",
            "check the user name and password (--sasl-username, "
            "--sasl-password-file, the security file) and --sasl-mechanism",
            debug,
        )
    if exc.refusal is Refusal.TLS:
        failure = _tls_failure(exc, where, sec, debug)
        if command == "simulate":  # it has no security flags of its own
            hint = (
                "simulate publishes in plain text: write a trace (--out) and "
                "publish it with mycroft replay and the security flags"
            )
            return dataclasses.replace(failure, hint=hint)
        return failure
    return _authorization_failure(exc, where, user, debug)


def _tls_failure(exc: KafkaRefused, where: str, sec: Any, debug: str) -> Failure:
    if exc.code == "PLAINTEXT_ON_TLS":
        protocol = sec.protocol if sec is not None else "PLAINTEXT"
        return Failure(
            ExitCode.TLS,
            f"{where} expects TLS; this client connects without it ({protocol})",
            "set --security-protocol SASL_SSL (or SSL) and --ssl-ca-file "
            "(infra/SECURITY.md)",
            debug,
        )
    if "verify failed" in exc.detail or "certificate" in exc.detail:
        has_ca = sec is not None and sec.ca_file
        ca = sec.ca_file if has_ca else "the system trust store"
        return Failure(
            ExitCode.TLS,
            f"cannot verify the TLS certificate of {where} against {ca}",
            "check --ssl-ca-file: the PEM of the CA that signed the broker's "
            "certificate (its SAN must name the address you connect to)",
            debug,
        )
    return Failure(
        ExitCode.TLS,
        f"the TLS handshake with {where} failed",
        "check --security-protocol (does that listener use TLS?) and --ssl-ca-file",
        debug,
    )


def _authorization_failure(
    exc: KafkaRefused, where: str, user: str, debug: str
) -> Failure:
    what = {
        "TOPIC_AUTHORIZATION_FAILED": "a topic this command uses",
        "GROUP_AUTHORIZATION_FAILED": "the consumer group this command uses",
        "CLUSTER_AUTHORIZATION_FAILED": "a cluster operation (creating topics)",
    }.get(exc.code, "what this command does")
    hint = (
        "use a group name its ACL grants (--group, --group-prefix), or grant it "
        "(infra/SECURITY.md, infra/kafka_acls.py)"
        if exc.code == "GROUP_AUTHORIZATION_FAILED"
        else "run it as a user whose role allows it (infra/SECURITY.md), or "
        "check --topic-prefix"
    )
    return Failure(
        ExitCode.AUTHORIZATION,
        f"{where} does not allow {user} {what} ({exc.code})",
        hint,
        debug,
    )


def explain(exc: BaseException, command: str = "", argv: Sequence[str] = ()) -> Failure:
    """The failure to report for ``exc``, raised by ``command`` run with ``argv``."""
    if (found := _refusal_in(exc)) is not None:
        return refusal_failure(found, command, argv)
    for kinds, failure in _RULES:
        if isinstance(exc, kinds):
            return failure(exc, command, argv)
    return Failure(
        ExitCode.FAILED,
        f"unexpected error: {type(exc).__name__}: {exc}",
        "rerun with --debug for the traceback, and report it",
    )


def _refusal_in(exc: BaseException) -> KafkaRefused | None:
    """The broker's refusal ``exc`` stands for or was raised from, if any."""
    seen: BaseException | None = exc
    for _ in range(4):  # the exception, then what it was raised from
        if seen is None:
            return None
        if (found := refused_exception(seen)) is not None:
            return found
        seen = seen.__cause__ or seen.__context__
    return None
