"""Checks ``mycroft`` makes before a command that needs a service.

A command pointed at a Kafka broker or an OpenSearch that does not answer
fails here within seconds, with the address and the setting to change,
instead of deep in a client library after its own timeouts. The node agent is
never checked: it spools while Kafka is away.
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
)
from mycroft.errors import BrokerError

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
    from mycroft.infra._kafka_props import check_bootstrap  # noqa: PLC0415

    address, setting = broker_setting(command, argv)
    if not address:
        return None  # the command itself says that one is needed
    extra = _kafka_security(command, argv)
    if extra is None:
        return None  # invalid security settings: the command itself says so
    try:
        check_bootstrap(address, timeout_s=CHECK_TIMEOUT_S, extra=extra)
    except BrokerError as exc:
        answer = "nothing accepts connections" if "nothing" in str(exc) else str(exc)
        return Failure(
            ExitCode.UNAVAILABLE,
            f"cannot reach Kafka at {address} ({answer})",
            f"start a broker (mycroft broker start) or point {setting} at a "
            "running one",
        )
    return None


def _kafka_security(command: str, argv: Sequence[str]) -> dict[str, str] | None:
    """The command's TLS/SASL client settings (``--security-protocol`` ...)."""
    from mycroft.errors import ConfigError  # noqa: PLC0415
    from mycroft.kafka_security import security_from_argv  # noqa: PLC0415

    prefix = "MYCROFT_STREAMS__" if command == "streams" else "MYCROFT_"
    try:
        return security_from_argv(argv, os.environ, prefix).librdkafka()
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
    return None
