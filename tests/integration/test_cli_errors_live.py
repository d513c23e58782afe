"""The ``mycroft`` error path where a failure needs a running broker to happen."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def _mycroft(*argv: str) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "mycroft", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stderr.splitlines()


def test_sinks_without_a_sink_is_a_usage_error(kafka_bootstrap: str) -> None:
    code, lines = _mycroft("sinks", "--bootstrap", kafka_bootstrap)
    assert code == 2, lines
    assert lines == [
        "mycroft sinks: give --prometheus-listen and/or --opensearch-url",
        "  see 'mycroft sinks --help'",
    ]


def test_a_metrics_address_in_use_names_the_flag(kafka_bootstrap: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        listen = f"127.0.0.1:{held.getsockname()[1]}"
        code, lines = _mycroft(
            "sinks", "--bootstrap", kafka_bootstrap, "--prometheus-listen", listen
        )
    assert code == 5, lines
    assert lines[-2:] == [
        f"mycroft sinks: cannot listen on {listen}: address already in use",
        "  choose another --prometheus-listen HOST:PORT, or stop what holds it",
    ]
