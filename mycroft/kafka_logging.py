"""librdkafka's log lines through Python logging, rate-limited.

Every Mycroft Kafka client passes ``client_logger()`` as confluent-kafka's
``logger`` setting, so librdkafka's lines (``%3|...|FAIL|...`` on stderr by
default) become records of the ``mycroft.librdkafka`` logger, with the same
handlers, format and level as the rest of Mycroft. While a broker is away
librdkafka repeats the same complaint every second per connection:
:class:`RateLimit` lets the first line of each kind through and then at most
one per ``every_s``, saying how many it held back. A line reporting a retry
librdkafka makes on its own (``... Coordinator load in progress: retrying``
while a fresh broker elects its coordinators) is DEBUG: it either resolves
itself or Mycroft's own log lines say what the outage means (spooling,
retrying, giving up), so only ``--debug`` shows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

LOGGER_NAME = "mycroft.librdkafka"
EVERY_S = 30.0
"""Shortest interval between two lines of one kind (client, facility)."""


class RateLimit(logging.Filter):
    """Pass a record of a kind at most once per ``every_s``; count the rest."""

    def __init__(
        self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self.last: dict[tuple[str, str], float] = {}
        self.held: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` goes out (then with the count held back)."""
        key = (str(record.name), _facility(record))
        now = self.clock()
        if now - self.last.get(key, -self.every_s) < self.every_s:
            self.held[key] = self.held.get(key, 0) + 1
            return False
        self.last[key] = now
        held = self.held.pop(key, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} similar lines held back)"
            record.args = None
        return True


class SelfRetried(logging.Filter):
    """Demote librdkafka's reports of its own retries (``...: retrying``) to
    DEBUG, dropped unless the logger is enabled for DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` goes out (at DEBUG if it reports a retry)."""
        if record.levelno <= logging.DEBUG:
            return True
        if not record.getMessage().rstrip().endswith("retrying"):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class ClientRateLimit(RateLimit):
    """:class:`RateLimit` for the records of Kafka client libraries written
    in Python (aiokafka, under Faust: ~100 lines a second while the broker is
    away), as a handler filter; every other record passes."""

    def __init__(self, prefixes: tuple[str, ...] = ("aiokafka",), **kw: Any) -> None:
        super().__init__(**kw)
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` goes out."""
        if not record.name.startswith(self.prefixes):
            return True
        return super().filter(record)


def _facility(record: logging.LogRecord) -> str:
    """librdkafka's facility (``FAIL``, ``GETPID``...) and client of a line;
    for another library's line, its message template."""
    if record.name != LOGGER_NAME:
        return str(record.msg)
    args = record.args if isinstance(record.args, tuple) else ()
    # confluent-kafka logs "%s [%s] %s" with (facility, client name, message)
    # on some versions and a preformatted message on others.
    if len(args) >= 2:
        return f"{args[0]}|{args[1]}"
    return str(record.msg).split(" ", 1)[0]


_LOGGER: logging.Logger | None = None


def client_logger() -> logging.Logger:
    """The logger every Mycroft Kafka client hands to librdkafka."""
    global _LOGGER  # noqa: PLW0603 - one filter instance for the process
    if _LOGGER is None:
        _LOGGER = logging.getLogger(LOGGER_NAME)
        _LOGGER.addFilter(SelfRetried())  # first: a dropped line is not counted
        _LOGGER.addFilter(RateLimit())
    return _LOGGER
