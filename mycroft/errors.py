"""The exception tree shared by every Mycroft package.

Detections are values, never exceptions; these are for bad input, bad
configuration and failing infrastructure.
"""

from __future__ import annotations


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


class SinkError(MycroftError):
    """A sink failed to accept a record.

    Attributes:
        retryable: whether the same write may succeed later.
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable
