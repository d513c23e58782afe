"""Stopping a ``mycroft agent`` subprocess in tests without leaking it."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path


def stop_agent(
    agent: subprocess.Popen[bytes],
    log: Path,
    sig: int = signal.SIGTERM,
    timeout_s: float = 20.0,
) -> int:
    """Send ``sig`` to the agent and return its exit code.

    An agent still running ``timeout_s`` later writes every thread's stack to
    ``log`` (SIGUSR1, see producers/agent/README.md), is killed, and fails the
    test: a leaked agent would go on shipping into the next test's topics.
    """
    agent.send_signal(sig)
    try:
        return agent.wait(timeout_s)
    except subprocess.TimeoutExpired:
        agent.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        agent.kill()
        agent.wait(10)
        msg = (
            f"the agent did not stop within {timeout_s:g} s of {sig!r}; stacks in {log}"
        )
        raise AssertionError(msg) from None
