"""What every local service launcher shares: one child process, its log, readiness.

The Kafka broker, OpenSearch and Prometheus launchers subclass
:class:`LocalService` and add only how to start and how to tell "ready".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Protocol, Self

from mycroft.errors import MycroftError
from mycroft.infra import _kafka_props as kp
from mycroft.logs import setup_logging


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


class Detachable(Protocol):
    """What :class:`DetachedCli` needs of a service it starts."""

    startup_s: float | None

    @property
    def pid(self) -> int | None: ...  # noqa: D102

    @property
    def url(self) -> str: ...  # noqa: D102

    def rss_bytes(self) -> int: ...  # noqa: D102

    def start(self, timeout_s: float = 60.0, *, detach: bool = False) -> str: ...  # noqa: D102


class DetachedCli:
    """``start`` / ``stop`` of a service left running between commands.

    ``start`` launches it detached unless the one recorded in
    ``<dir>/<state_name>`` is still alive, and prints its URL; ``stop`` sends
    it SIGTERM and waits up to ``--timeout``. A process counts as ours only
    while its command line names ``<dir>`` (and ``marker``), so a recycled
    pid is never killed.
    """

    def __init__(
        self,
        state_name: str,
        make: Callable[[argparse.Namespace], Detachable],
        marker: bytes = b"",
    ) -> None:
        self.state_name, self.make, self.marker = state_name, make, marker

    def ours(self, pid: int, workdir: Path) -> bool:
        """Whether ``pid`` is alive and is the service of ``workdir``."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return self.marker in cmdline and str(workdir.resolve()).encode() in cmdline

    def run(self, args: argparse.Namespace) -> int:
        """Carry out ``args.command`` (``start`` or ``stop``); return 0."""
        state_path = args.dir / self.state_name
        state = kp.read_state(args.dir, self.state_name)
        pid = state.get("pid")
        alive = isinstance(pid, int) and self.ours(pid, args.dir)
        if args.command == "start":
            if not alive:
                server = self.make(args)
                server.start(args.timeout, detach=True)
                state = {
                    "pid": server.pid,
                    "url": server.url,
                    "startup_s": server.startup_s,
                    "rss_bytes": server.rss_bytes(),
                }
                state_path.write_text(json.dumps(state, indent=2), "utf-8")
            print(state["url"])
            return 0
        if alive and isinstance(pid, int):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + args.timeout
            while self.ours(pid, args.dir) and time.monotonic() < deadline:
                time.sleep(0.2)
        state_path.unlink(missing_ok=True)
        return 0


def run_cli(
    parser: argparse.ArgumentParser,
    handler: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None,
) -> int:
    """Parse ``argv`` (``--dir`` made absolute), log to stderr, run ``handler``;
    a :class:`MycroftError` becomes ``error: ...`` and exit code 1."""
    args = parser.parse_args(argv)
    args.dir = args.dir.resolve()
    setup_logging()
    try:
        return handler(args)
    except MycroftError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
