"""Checks ``mycroft`` makes before a command that needs a service.

A command pointed at a Kafka broker or an OpenSearch that does not answer
fails here within seconds, with the address and the setting to change,
instead of deep in a client library after its own timeouts; one that answers
and refuses the client (its credentials, its TLS settings) says so instead
(:mod:`mycroft.kafka_diagnosis`). The node agent is checked only for such a
refusal: it spools while Kafka is away.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Sequence

from mycroft.cli_errors import (
    OPENSEARCH_FLAG,
    ExitCode,
    Failure,
    broker_setting,
    flag_value,
    refusal_failure,
)

CHECK_TIMEOUT_S = 5.0
KAFKA_COMMANDS = {
    "topics",
    "simulate",
    "replay",
    "streams",
    "sinks",
    "incidents",
    "demo",
}
_HELP = {"-h", "--help"}


def _kafka(command: str, argv: Sequence[str]) -> Failure | None:
    from mycroft.infra._kafka_props import tcp_open  # noqa: PLC0415
    from mycroft.kafka_diagnosis import probe  # noqa: PLC0415

    address, setting = broker_setting(command, argv)
    if not address:
        return None  # the command itself says that one is needed
    extra = _kafka_security(command, argv)
    if extra is None:
        return None  # invalid security settings: the command itself says so
    answer = "nothing accepts connections"
    host, _, port = address.split(",", maxsplit=1)[0].strip().rpartition(":")
    if port.isdigit() and tcp_open(host.strip("[]"), int(port), CHECK_TIMEOUT_S):
        answered, refused = probe(address, extra, timeout_s=CHECK_TIMEOUT_S)
        if refused is not None:
            return refusal_failure(refused, command, argv)
        if answered:
            return None
        answer = f"no Kafka metadata within {CHECK_TIMEOUT_S:g} s"
    return Failure(
        ExitCode.UNAVAILABLE,
        f"cannot reach Kafka at {address} ({answer})",
        f"start a broker (mycroft broker start) or point {setting} at a running one",
    )


def _refusal(
    command: str, argv: Sequence[str], address: str, extra: dict[str, str]
) -> Failure | None:
    """The failure to report when the broker that answers refused the
    client (credentials, TLS), None when it is just away."""
    from mycroft.infra._kafka_props import tcp_open  # noqa: PLC0415
    from mycroft.kafka_diagnosis import probe  # noqa: PLC0415

    host, _, port = address.split(",", maxsplit=1)[0].strip().rpartition(":")
    if not port.isdigit() or not tcp_open(host.strip("[]"), int(port), 2.0):
        return None  # away: not a refusal
    _, found = probe(address, dict(extra), timeout_s=CHECK_TIMEOUT_S)
    return refusal_failure(found, command, argv) if found is not None else None


def _agent(argv: Sequence[str]) -> Failure | None:
    """The agent spools while Kafka is away, but credentials or TLS settings
    the broker refuses would keep it spooling for ever: those stop it."""
    address, _ = broker_setting("agent", argv)
    extra = _kafka_security("agent", argv) if address else None
    if not address or not extra:
        return None  # no broker, no security settings: nothing to refuse
    return _refusal("agent", argv, address, extra)


def _kafka_security(command: str, argv: Sequence[str]) -> dict[str, str] | None:
    """The command's TLS/SASL client settings (``--security-protocol`` ...)."""
    from mycroft.errors import ConfigError  # noqa: PLC0415
    from mycroft.kafka_security import env_prefixes, security_from_argv  # noqa: PLC0415

    try:
        return security_from_argv(argv, os.environ, env_prefixes(command)).librdkafka()
    except ConfigError:
        return None


def _opensearch(argv: Sequence[str]) -> Failure | None:
    url = flag_value(argv, OPENSEARCH_FLAG)
    setting = OPENSEARCH_FLAG
    if url is None and (env := os.environ.get("MYCROFT_SINKS__OPENSEARCH_URL")):
        url, setting = env, "MYCROFT_SINKS__OPENSEARCH_URL"
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        return Failure(
            ExitCode.USAGE,
            f"{setting} must be an http:// or https:// URL, not {url!r}",
        )
    try:
        with urllib.request.urlopen(url, timeout=CHECK_TIMEOUT_S):  # noqa: S310
            pass
    except urllib.error.HTTPError:
        return None  # it answers; authentication and the like are the sink's
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Failure(
            ExitCode.UNAVAILABLE,
            f"cannot reach OpenSearch at {url} ({reason})",
            f"start it (mycroft opensearch start) or point {setting} at a running one",
        )
    return None


def preflight(command: str, argv: Sequence[str]) -> Failure | None:
    """Why ``command argv`` cannot run now, or None when its services answer."""
    if _HELP.intersection(argv):
        return None
    if command == "topics" and "create" not in argv:
        return None
    if command == "sinks" and (failure := _opensearch(argv)) is not None:
        return failure
    if command in KAFKA_COMMANDS:
        return _kafka(command, argv)
    if command == "agent":
        return _agent(argv)
    return None
