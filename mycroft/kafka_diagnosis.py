"""Tell a broker that refuses a client from one that is away.

A wrong SASL password, a CA the client does not trust, a plain-text client
against a TLS listener and a missing ACL all end, in librdkafka, as
"Broker transport failure" or a timeout: the cause is only in the error
callback, the log, or a per-record error code. This module collects those
(:class:`ErrorWatch`), names the cause (:class:`Refusal`) and raises it as a
:class:`~mycroft.errors.KafkaRefused`, which every command reports in its own
words and with its own exit code (:mod:`mycroft.cli_errors`).
"""

from __future__ import annotations

import collections
import logging
import socket
import ssl
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from mycroft.errors import KafkaRefused, Refusal
from mycroft.kafka_logging import client_logger

_AUTHENTICATION = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
_AUTHORIZATION = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.DELEGATION_TOKEN_AUTHORIZATION_FAILED,
}
_TOPIC, _GROUP, _CLUSTER = (
    "TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
)  # fmt: skip
_AIOKAFKA = {
    "TopicAuthorizationFailedError": (Refusal.AUTHORIZATION, _TOPIC),
    "GroupAuthorizationFailedError": (Refusal.AUTHORIZATION, _GROUP),
    "ClusterAuthorizationFailedError": (Refusal.AUTHORIZATION, _CLUSTER),
    "SaslAuthenticationFailedError": (
        Refusal.AUTHENTICATION, "SASL_AUTHENTICATION_FAILED"
    ),
    "SSLCertVerificationError": (Refusal.TLS, "certificate verify failed"),
}  # fmt: skip
"""The Faust worker's client (aiokafka) raises these by class."""


def refusal_of(err: KafkaError) -> Refusal | None:
    """What ``err`` says the broker refused, or None when it is no refusal."""
    code = err.code()
    if code in _AUTHENTICATION:
        return Refusal.AUTHENTICATION
    if code in _AUTHORIZATION:
        return Refusal.AUTHORIZATION
    if code == KafkaError._SSL:
        return Refusal.TLS
    return None


def refused(err: KafkaError) -> KafkaRefused | None:
    """``err`` as a :class:`KafkaRefused`, or None when it is no refusal."""
    kind = refusal_of(err)
    if kind is None:
        return None
    return KafkaRefused(kind, err.name(), err.str())


def refused_exception(exc: BaseException) -> KafkaRefused | None:
    """The refusal an exception of a Kafka client stands for, if any."""
    if isinstance(exc, KafkaRefused):
        return exc
    if isinstance(exc, KafkaException) and exc.args:
        first = exc.args[0]
        return refused(first) if isinstance(first, KafkaError) else None
    for cls in type(exc).__mro__:
        if cls.__name__ in _AIOKAFKA:
            kind, code = _AIOKAFKA[cls.__name__]
            return KafkaRefused(kind, code, str(exc) or cls.__name__)
    return None


class ErrorWatch:
    """An ``error_cb`` for a librdkafka client: keeps its latest errors."""

    def __init__(self, keep: int = 16) -> None:
        self._errors: collections.deque[KafkaError] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def __call__(self, err: KafkaError) -> None:
        with self._lock:
            self._errors.append(err)

    def refusal(self) -> KafkaRefused | None:
        """The first refusal among the errors seen, if any."""
        with self._lock:
            errors = list(self._errors)
        for err in errors:
            if (found := refused(err)) is not None:
                return found
        return None


def raise_if_refused(watch: ErrorWatch, exc: KafkaException) -> None:
    """Raise the refusal behind ``exc`` (its own error, else one ``watch``
    saw); return when there is none.

    Raises:
        KafkaRefused: the broker refused the client.
    """
    found = refused_exception(exc) or watch.refusal()
    if found is not None:
        raise found from exc


def speaks_tls(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether the listener at ``host:port`` completes a TLS handshake (the
    certificate is not checked: this only tells TLS from plain text)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


def _first_address(bootstrap: str) -> tuple[str, int] | None:
    host, _, port = bootstrap.split(",", maxsplit=1)[0].strip().rpartition(":")
    return (host.strip("[]"), int(port)) if port.isdigit() else None


def probe(
    bootstrap: str, extra: dict[str, Any], timeout_s: float = 5.0
) -> tuple[bool, KafkaRefused | None]:
    """Ask ``bootstrap`` for metadata with the client settings ``extra``.

    Returns:
        Whether the broker answered, and why it refused the client (None:
        it did not, or it is away). A refusal is returned as soon as the
        client reports it, not after ``timeout_s``.
    """
    watch = ErrorWatch()
    # Through Python logging as every client, but not shown: the refusal is
    # reported in words (with --debug, librdkafka's own error too).
    quiet = client_logger().getChild("probe")
    quiet.propagate = False
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": quiet,
                              "error_cb": watch} | extra  # fmt: skip
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            admin.list_topics(timeout=min(left, 0.5))
        except KafkaException:
            admin.poll(0)  # serves the error callbacks
            if (found := watch.refusal()) is not None:
                return True, found
            if (found := _plain_client_on_tls(bootstrap, extra)) is not None:
                return True, found
            continue
        return True, None
    return False, None


def _plain_client_on_tls(bootstrap: str, extra: dict[str, Any]) -> KafkaRefused | None:
    """A client without TLS is cut off by a TLS listener with no error of its
    own: a handshake that succeeds there says that is what happened."""
    protocol = str(extra.get("security.protocol", "PLAINTEXT")).upper()
    address = _first_address(bootstrap)
    if protocol.endswith("SSL") or address is None or not speaks_tls(*address):
        return None
    return KafkaRefused(
        Refusal.TLS,
        "PLAINTEXT_ON_TLS",
        f"{bootstrap}: the listener speaks TLS; the client connected with "
        f"security protocol {protocol}",
    )
