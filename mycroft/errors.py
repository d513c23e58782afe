"""The exception tree shared by every Mycroft package.

Detections are values, never exceptions; these are for bad input, bad
configuration and failing infrastructure.
"""

from __future__ import annotations

from enum import Enum


class MycroftError(Exception):
    """Base of every error Mycroft raises on purpose."""


class ConfigError(MycroftError, ValueError):
    """A setting, flag or argument is invalid; the message says which and why."""


class InputError(ConfigError):
    """A path, file or name given to a command cannot be used (a file that is
    not what the command reads, an id that names nothing); the message says
    which."""


class SchemaError(MycroftError):
    """An Avro schema is missing, malformed or incompatible."""


class EncodeError(MycroftError):
    """A record could not be encoded with its schema."""


class DecodeError(MycroftError):
    """A Kafka record could not be decoded.

    Attributes:
        reason: short machine-readable reason (``not-avro``, ``unknown-fingerprint``,
            ``truncated``, ``invalid``).
        topic, partition, offset: where the record came from, when known.
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.detail = detail
        self.topic = topic
        self.partition = partition
        self.offset = offset
        where = f"{topic}[{partition}]@{offset}" if topic is not None else "<no source>"
        super().__init__(f"cannot decode record at {where}: {reason}: {detail}")

    def located(self, topic: str, partition: int, offset: int) -> DecodeError:
        """Return a copy that names where the record came from."""
        return DecodeError(
            self.reason, self.detail, topic=topic, partition=partition, offset=offset
        )


class BrokerError(MycroftError):
    """The Kafka broker could not be fetched, started, reached or stopped."""


class Refusal(Enum):
    """Why a Kafka broker that answers turned a client away."""

    AUTHENTICATION = "authentication"  # wrong SASL user, password or mechanism
    TLS = "tls"  # CA not trusted, or TLS on one side only
    AUTHORIZATION = "authorization"  # no ACL for the topic, group or cluster


class KafkaRefused(BrokerError):
    """The broker answered and refused the client: not an outage.

    Attributes:
        refusal: authentication, TLS or authorization.
        code: the client library's error name (``TOPIC_AUTHORIZATION_FAILED``).
        detail: the client library's own message (shown with ``--debug``).
    """

    def __init__(self, refusal: Refusal, code: str, detail: str) -> None:
        super().__init__(f"{refusal.value} refused: {code}: {detail}")
        self.refusal = refusal
        self.code = code
        self.detail = detail


class SinkError(MycroftError):
    """A sink failed to accept a record.

    Attributes:
        retryable: whether the same write may succeed later.
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable
