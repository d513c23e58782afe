"""What every local service launcher shares: one child process, its log, readiness.

The Kafka broker, OpenSearch and Prometheus launchers subclass
:class:`LocalService` and add only how to start and how to tell "ready".
"""

from __future__ import annotations

import subprocess
import tempfile
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

from mycroft.errors import MycroftError
from mycroft.infra import _kafka_props as kp


class LocalService(ABC):
    """A server process on loopback that this project starts and stops.

    A process still running when the object is collected or Python exits is
    stopped, unless it was started detached; a temporary work folder is
    deleted by :meth:`close` unless ``keep``.
    """

    display_name: ClassVar[str] = "the service"
    log_name: ClassVar[str] = "service.log"
    error: ClassVar[type[MycroftError]] = MycroftError

    def __init__(self, workdir: Path | None, *, keep: bool, prefix: str) -> None:
        self._runtime = kp.Runtime()
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix=prefix))
            self._runtime.owned_dir = None if keep else workdir
        self._workdir = workdir.resolve()
        self._exit_code: int | None = None
        self.startup_s: float | None = None
        self._finalizer = weakref.finalize(self, kp.reap, self._runtime)

    @property
    def workdir(self) -> Path:
        """The folder holding this service's config, data and logs."""
        return self._workdir

    @property
    def log_path(self) -> Path:
        """The process's stdout and stderr, appended across restarts."""
        return self._workdir / self.log_name

    @property
    def pid(self) -> int | None:
        """The process id while it runs, else None."""
        proc = self._runtime.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        """Whether the process is alive (not necessarily ready)."""
        return self.pid is not None

    @property
    def exit_code(self) -> int | None:
        """How the last run ended (e.g. 143 after SIGTERM, -9 killed); None before."""
        return self._exit_code

    def rss_bytes(self) -> int:
        """Resident set size of the process in bytes (from ``/proc``)."""
        rss = None if self.pid is None else kp.vmrss_bytes(self.pid)
        if rss is None:
            raise self.error(f"{self.display_name} is not running; start() it first")
        return rss

    def _popen(self, cmd: list[str], detach: bool, **popen: Any) -> None:
        """Start ``cmd`` with stdout and stderr appended to :attr:`log_path`."""
        if not self._finalizer.alive:
            raise self.error(f"{self.display_name} was closed; create a new one")
        with self.log_path.open("ab") as out:
            self._runtime.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self._workdir, start_new_session=detach, **popen,
            )  # fmt: skip
        self._runtime.detached = detach

    def _wait_until(
        self,
        check: Callable[[], bool],
        timeout_s: float,
        what: str = "ready",
        *,
        stop_on_failure: bool = True,
    ) -> None:
        """Poll ``check`` until true; raise (stopping first) on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while not check():
            proc = self._runtime.proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                self.stop()
                what_ = f"{self.display_name} exited ({code}) before {what}"
                raise self._failure(what_)
            if time.monotonic() > deadline:
                if stop_on_failure:
                    self.stop(timeout_s=5.0)
                raise self._failure(
                    f"{self.display_name} was not {what} after {timeout_s:.0f} s"
                )
            time.sleep(0.2)

    def _failure(self, what: str) -> MycroftError:
        tail = kp.tail_lines(self.log_path)
        return self.error(f"{what}; log {self.log_path} ends with:\n{tail}")

    def _before_stop(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Hook: release clients of the service before it goes away."""

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; idempotent; data stays."""
        self._before_stop()
        proc, self._runtime.proc = self._runtime.proc, None
        if proc is not None:
            kp.terminate(proc, timeout_s)
            self._exit_code = proc.returncode

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop it and delete a temporary work folder (unless ``keep``)."""
        self.stop(timeout_s)
        self._finalizer()

    @abstractmethod
    def start(self, timeout_s: float = 60.0, *, detach: bool = False) -> str:
        """Start the service and wait until it is ready; return its address."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
