"""``mycroft agent --source sim``: one host's share of a simulated job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mycroft.errors import ConfigError
from mycroft.producers.agent.sources import simulate_host
from mycroft.producers.tracefile import read_records

SIM = "--ranks 16 --tp 8 --pp 2 --dp 1 --duration 2 --seed 3 --truth {truth}"


def _hosts(trace: Path) -> set[str]:
    hosts = set()
    for _, record in read_records(trace):
        hosts.add(record.header.host if hasattr(record, "header") else record.host)
    return hosts


def test_agent_keeps_only_its_own_host(tmp_path: Path) -> None:
    truth = tmp_path / "t.json"
    trace = simulate_host(SIM.format(truth=truth), "node0001", "job-a", tmp_path)
    assert _hosts(trace) == {"node0001"}
    assert json.loads(truth.read_text())["job_id"] == "job-a"


def test_star_keeps_every_host(tmp_path: Path) -> None:
    trace = simulate_host(SIM.format(truth=tmp_path / "t.json"), "*", "j", tmp_path)
    assert _hosts(trace) == {"node0000", "node0001"}


def test_bad_sim_args_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sim-args"):
        simulate_host("--ranks nope --truth x", "*", "j", tmp_path)


def test_the_agent_never_needs_faust_scipy_or_networkx() -> None:
    script = (
        "import sys\n"
        "for name in ('faust', 'scipy', 'networkx', 'aiokafka', 'mode'):\n"
        "    sys.modules[name] = None\n"
        "import mycroft.producers.agent.cli, mycroft.producers.agent.daemon\n"
        "import mycroft.producers.ring, mycroft.producers.replay\n"
        "from mycroft.producers.agent.cli import main\n"
        "assert main(['--help']) == 0\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
