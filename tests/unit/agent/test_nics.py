"""NIC port state from sysfs: the reader, the setting, and the agent's heartbeat."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mycroft.producers.agent.cli import load_settings
from mycroft.producers.agent.daemon import Agent
from mycroft.producers.agent.nics import read_ports
from mycroft.producers.agent.shipper import Shipper
from mycroft.producers.agent.sources import ReplaySource, RingSource
from mycroft.producers.agent.spool import Spool
from mycroft.producers.tracefile import TraceFileWriter
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Heartbeat, NicPort
from mycroft.topics import TopicSet

from .test_spool_shipper import FakeTransport

EXPECTED = (
    NicPort("mlx5_0", 1, True, 0, 2),
    NicPort("mlx5_0", 2, False, 3, -1),
    NicPort("mlx5_1", 1, True, 255, -1),
)


def _port(
    root: Path, nic: str, port: str, state: str, downed: str | None, rec: str | None
) -> Path:
    d = root / nic / "ports" / port
    (d / "counters").mkdir(parents=True)
    (d / "state").write_text(state)
    for name, value in (("link_downed", downed), ("link_error_recovery", rec)):
        if value is not None:
            (d / "counters" / name).write_text(value)
    return d


def _sysfs(root: Path) -> Path:
    """mlx5_0: port 1 up, port 2 down with a garbage counter; mlx5_1: port 1 up,
    saturated, one counter unreadable (a folder); mlx5_bond: no ports folder."""
    _port(root, "mlx5_0", "2", "1: DOWN\n", "3\n", "n/a\n")
    _port(root, "mlx5_0", "1", "4: ACTIVE\n", "0\n", "2\n")
    d = _port(root, "mlx5_1", "1", "4: ACTIVE\n", "255\n", None)
    (d / "counters" / "link_error_recovery").mkdir()
    (root / "mlx5_bond").mkdir()
    return root


def test_reads_every_port_sorted_with_unreadable_counters_as_minus_one(
    tmp_path: Path,
) -> None:
    assert read_ports(_sysfs(tmp_path / "ib")) == EXPECTED


def test_missing_root_is_no_ports(tmp_path: Path) -> None:
    assert read_ports(tmp_path / "absent") == ()


@pytest.mark.parametrize("state", ["", "4: WEIRD\n", "\xff\xfe"])
def test_port_of_unknown_state_is_left_out(tmp_path: Path, state: str) -> None:
    root = _sysfs(tmp_path / "ib")
    (root / "mlx5_0" / "ports" / "2" / "state").write_text(state, "latin-1")
    assert read_ports(root) == (EXPECTED[0], EXPECTED[2])


def test_only_active_is_up_with_or_without_the_state_number(tmp_path: Path) -> None:
    root = tmp_path / "ib"
    _port(root, "a", "1", "ACTIVE", "1", "1")
    _port(root, "b", "1", "5: ACTIVE_DEFER\n", "1", "1")
    _port(root, "c", "1", "2: INIT\n", "1", "1")
    assert [p.up for p in read_ports(root)] == [True, False, False]


def test_each_problem_kind_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _sysfs(tmp_path / "ib")
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, "mycroft.producers.agent.nics"):
        for _ in range(3):
            assert read_ports(root, warned) == EXPECTED
    assert warned == {"ports", "counter"}
    assert len(caplog.records) == 2
    assert "nic_sysfs=''" in caplog.text


def test_a_file_as_root_is_no_ports_and_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ib"
    root.write_text("not a folder")
    with caplog.at_level(logging.WARNING, "mycroft.producers.agent.nics"):
        assert read_ports(root) == ()
    assert "cannot list RDMA devices" in caplog.text


def test_nic_sysfs_has_a_default_a_flag_a_variable_and_a_file_key(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "agent.toml"
    conf.write_text('[agent]\nnic_sysfs = "/from/file"\n')
    assert load_settings([], {}).nic_sysfs == "/sys/class/infiniband"
    assert load_settings(["--config", str(conf)], {}).nic_sysfs == "/from/file"
    env = {"MYCROFT_NIC_SYSFS": "/from/env"}
    assert load_settings(["--config", str(conf)], env).nic_sysfs == "/from/env"
    assert load_settings(["--nic-sysfs", ""], env).nic_sysfs == ""


def _agent(tmp_path: Path, source: RingSource | ReplaySource, sysfs: str) -> Agent:
    spool = Spool(tmp_path / "spool", 1 << 20, 1 << 12)
    return Agent(
        job_id="j",
        host="h",
        source=source,
        shipper=Shipper(spool, FakeTransport()),
        topics=TopicSet("p."),
        nic_sysfs=sysfs,
    )


def _shipped_heartbeats(agent: Agent) -> list[Heartbeat]:
    agent.tick()
    agent.shipper.pump()
    transport = agent.shipper.transport
    assert isinstance(transport, FakeTransport)
    codec = Codec()
    records = [codec.decode(e.value) for e in transport.delivered]
    agent.source.close()
    agent.shipper.spool.close()
    return [r for r in records if isinstance(r, Heartbeat)]


def test_ring_agent_heartbeat_carries_the_ports(tmp_path: Path) -> None:
    (tmp_path / "rings").mkdir()
    sysfs = str(_sysfs(tmp_path / "ib"))
    agent = _agent(tmp_path, RingSource(tmp_path / "rings"), sysfs)
    [beat] = _shipped_heartbeats(agent)
    assert beat.nics == EXPECTED


def test_ring_agent_with_reading_off_sends_no_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rings").mkdir()
    _sysfs(tmp_path / "ib")
    monkeypatch.chdir(tmp_path / "ib")  # "" must not read the current folder
    [beat] = _shipped_heartbeats(_agent(tmp_path, RingSource(tmp_path / "rings"), ""))
    assert beat.nics == ()


def test_replayed_heartbeats_keep_their_ports_and_the_agent_adds_none(
    tmp_path: Path,
) -> None:
    simulated = (NicPort("mlx5_3", 1, False, 7, 0),)
    traced = Heartbeat("j", "h", 1, 2, 100, 0.0, 0, 0, 0, 0, 0, 0, (), simulated)
    trace = tmp_path / "t.trace"
    with TraceFileWriter(trace) as w:
        w.write(traced, 2)
    sysfs = str(_sysfs(tmp_path / "ib"))
    beats = _shipped_heartbeats(_agent(tmp_path, ReplaySource(trace), sysfs))
    assert [b.nics for b in beats] == [simulated, ()]


def test_heartbeat_with_ports_round_trips_through_the_codec() -> None:
    hb = Heartbeat("j", "h", 1, 2, 100, 0.5, 3, 4, 5, 6, 7, 8, (), EXPECTED)
    codec = Codec()
    assert codec.decode(codec.encode(hb)) == hb
