"""Say in Mycroft's words when a command's Kafka goes away and comes back.

Kafka clients reconnect by themselves and log each failed attempt in their
own terms (librdkafka's and aiokafka's lines, rate-limited by
:mod:`mycroft.kafka_logging`); nothing there says what the outage means for
the command. :class:`BrokerWatch` checks on a daemon thread, every
``every_s``, that an address of the bootstrap list accepts TCP connections,
and logs each change: ``Kafka at HOST:PORT unreachable (...): <what the
command does meanwhile>`` and ``Kafka at HOST:PORT reachable again``. It
never blocks the command's own loop (the stream worker's event loop).
The node agent says the same from its shipper, with what it spooled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mycroft.infra._kafka_props import tcp_open

log = logging.getLogger(__name__)

EVERY_S = 5.0
"""Seconds between two checks."""
PRODUCING = (
    "records wait in the producer's queue; one not delivered within 120 s "
    "counts as failed (exit 1)"
)
"""What ``replay`` and ``simulate --kafka`` do while Kafka is away."""


def _any_open(bootstrap: str) -> bool:
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        if port.isdigit() and tcp_open(host.strip("[]") or "127.0.0.1", int(port)):
            return True
    return False


class BrokerWatch:
    """Log when no address of ``bootstrap`` accepts connections, saying what
    the command does meanwhile (``meanwhile``), and when one does again."""

    def __init__(
        self,
        bootstrap: str,
        meanwhile: str = "retrying until it answers",
        every_s: float = EVERY_S,
        check: Callable[[str], bool] = _any_open,
    ) -> None:
        self.bootstrap, self.meanwhile = bootstrap, meanwhile
        self.every_s, self._check = every_s, check
        self.up = True
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="broker-watch", daemon=True
        )

    def start(self) -> None:
        """Check now and then every ``every_s`` on a daemon thread."""
        self._thread.start()

    def step(self) -> None:
        """One check; log a change."""
        up = self._check(self.bootstrap)
        if self.up and not up:
            log.warning(
                "Kafka at %s unreachable (no broker accepts connections): %s",
                self.bootstrap, self.meanwhile,
            )  # fmt: skip
        elif up and not self.up:
            log.info("Kafka at %s reachable again", self.bootstrap)
        self.up = up

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.every_s)

    def close(self) -> None:
        """Stop checking."""
        self._stop.set()

    def __enter__(self) -> BrokerWatch:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
