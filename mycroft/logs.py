"""One logging setup for every ``mycroft`` command.

Lines go to stderr as ``TIME LEVEL LOGGER: MESSAGE``
(:data:`LOG_FORMAT`), the level INFO unless a command's setting says
otherwise; ``--debug`` makes Mycroft's own loggers DEBUG. librdkafka's lines
arrive as ``mycroft.librdkafka`` records, rate-limited
(:mod:`mycroft.kafka_logging`). A process whose logging is already
configured (a test runner, an application embedding Mycroft) keeps its
handlers and levels untouched.
"""

from __future__ import annotations

import logging
import sys

from mycroft.kafka_logging import client_logger

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stderr handler this module installs (recognized on a second call)."""


def setup_logging(level: str | int = "INFO", *, debug: bool = False) -> None:
    """Log to stderr in :data:`LOG_FORMAT` at ``level`` (DEBUG with ``debug``).

    Safe to call more than once: a later call changes the level only.

    Raises:
        ValueError: ``level`` is not a level name or number.
    """
    if isinstance(level, str):
        if level.upper() not in LEVELS:
            raise ValueError(f"unknown log level {level!r}: {', '.join(LEVELS)}")
        level = logging.getLevelName(level.upper())
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, _Handler)]
    if not root.handlers:
        handler = _Handler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
        ours = [handler]
    if ours:
        root.setLevel(level)
        logging.getLogger("mycroft").setLevel(logging.DEBUG if debug else 0)
    client_logger()  # librdkafka's lines: rate-limited, through these handlers
