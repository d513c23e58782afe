"""A ``mycroft streams worker`` child process: start, wait until ready, stop.

Shared by the demo, the benchmarks and the integration tests, which all run
real workers as separate processes (as in production, one per container).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mycroft.errors import MycroftError
from mycroft.streams.faust_settings import StreamSettings, child_env, to_argv

READY_MARK = "[^Worker]: Ready"
"""What Faust logs once the worker consumes."""


class WorkerProcess:
    """One worker with ``settings``, its output appended to ``log_path``."""

    def __init__(
        self, settings: StreamSettings, log_path: Path, extra: list[str] | None = None
    ) -> None:
        self.settings, self.log_path = settings, log_path
        self.extra = list(extra or [])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the worker; return once it logs :data:`READY_MARK`.

        Raises:
            MycroftError: it exited or was not ready in time (with its log).
        """
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        cmd = [sys.executable, "-m", "mycroft", "streams", *to_argv(self.settings)]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, *self.extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=os.environ | {"PYTHONUNBUFFERED": "1"} | child_env(self.settings),
            )
        self.wait_log(READY_MARK, timeout_s, start)

    def log(self, start: int = 0) -> str:
        """The worker's output from byte ``start`` on."""
        return self.log_path.read_bytes()[start:].decode("utf-8", "replace")

    def wait_log(self, text: str, timeout_s: float, start: int = 0) -> None:
        """Wait until ``text`` appears in the log after byte ``start``.

        Raises:
            MycroftError: the worker exited or ``timeout_s`` passed first.
        """
        deadline = time.monotonic() + timeout_s
        while text not in self.log(start):
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise MycroftError(
                    f"stream worker exited ({code}); log {self.log_path}:\n"
                    f"{self.log()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise MycroftError(
                    f"no {text!r} from the stream worker in {timeout_s:.0f} s; log "
                    f"{self.log_path}:\n{self.log()[-3000:]}"
                )
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is flushed or committed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
