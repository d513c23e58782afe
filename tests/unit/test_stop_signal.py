"""StopSignal: a stop flag that SIGTERM can set while the main loop waits on it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mycroft.stop_signal import StopSignal


def _run_python(code: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_an_event_set_by_a_signal_inside_its_own_wait_deadlocks() -> None:
    """Why StopSignal exists: the handler's ``Event.set()`` waits for the lock
    that the interrupted ``Event.wait()`` of the same thread holds."""
    with pytest.raises(subprocess.TimeoutExpired):
        _run_python(
            """
            import os, signal, threading
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            with stop._cond:  # where Event.wait holds it
                os.kill(os.getpid(), signal.SIGTERM)
            """,
            timeout_s=3,
        )


def test_a_signal_inside_wait_stops_the_wait() -> None:
    got = _run_python(
        """
        import os, signal, threading, time
        from mycroft.stop_signal import StopSignal
        stop = StopSignal()
        stop.install()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        print(stop.wait(30), stop, round(time.monotonic() - t0, 1))
        """,
        timeout_s=20,
    )
    assert got.returncode == 0, got.stderr
    ok, name, waited = got.stdout.split()
    assert (ok, name) == ("True", "SIGTERM")
    assert float(waited) < 5


def test_set_from_another_thread_and_timeouts() -> None:
    stop = StopSignal()
    assert not stop.wait(0.05)
    assert str(stop) == "not set"
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    assert stop.wait(10)
    assert time.monotonic() - t0 < 5
    assert str(stop) == "set"


def test_install_and_restore_the_handlers() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    stop = StopSignal()
    stop.install([signal.SIGUSR2])
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.wait(5)
        assert stop.signum == signal.SIGUSR2
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGUSR2) == before
