"""A stop request that SIGTERM / SIGINT can set without taking a lock.

Python runs a signal handler in the main thread between two bytecodes, also
while that thread holds a lock. ``threading.Event`` guards its flag with a
non-reentrant lock that ``wait`` holds around its sleep: a SIGTERM landing in
that window makes the handler's ``Event.set()`` wait forever on a lock its
own thread holds, and the process never stops (see the warning in the
``signal`` module's documentation). :class:`StopSignal` is the same
interface with a plain attribute for the flag and a sleep for the wait, so a
daemon's main loop can wait on it and its handler can set it at any time.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any, Protocol

_SLICE_S = 0.01


class Stopper(Protocol):
    """What a main loop needs of its stop request (``threading.Event`` has it)."""

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until a stop is requested or ``timeout`` s passed; return
        :meth:`is_set`."""
        ...


class StopSignal:
    """A stop flag for one process's main loop, settable from a signal handler.

    Attributes:
        signum: The signal that requested the stop (0: none yet; -1: :meth:`set`).
    """

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def install(self, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """Make ``signals`` request the stop (main thread only)."""
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # One attribute store: nothing here may take a lock.
        self.signum = signum

    def set(self) -> None:
        """Request the stop from code (any thread)."""
        if not self.signum:
            self.signum = -1

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self.signum != 0

    def __str__(self) -> str:
        if self.signum > 0:
            return signal.Signals(self.signum).name
        return "set" if self.signum else "not set"

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep in short slices until a stop is requested or ``timeout`` s
        passed (None: until requested); return :meth:`is_set`."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.signum:
            left = _SLICE_S if end is None else min(_SLICE_S, end - time.monotonic())
            if left <= 0:
                break
            time.sleep(left)
        return self.is_set()
