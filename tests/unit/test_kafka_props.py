"""Pure parts of the Kafka launcher: config rendering, cluster ids, flags, markers."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mycroft.errors import BrokerError, ConfigError
from mycroft.infra import _kafka_props as kp

PORTS = kp.BrokerPorts(client=39092, controller=39093)


def _props(tmp_path: Path) -> dict[str, str]:
    return kp.server_properties(PORTS, tmp_path / "data")


def test_cluster_id_is_22_urlsafe_chars_of_16_bytes() -> None:
    fixed = uuid.UUID("12345678-1234-5678-1234-567812345678")
    cluster_id = kp.new_cluster_id(lambda: fixed)
    assert len(cluster_id) == 22
    assert "=" not in cluster_id
    assert base64.urlsafe_b64decode(cluster_id + "==") == fixed.bytes


def test_cluster_id_redraws_ids_starting_with_dash() -> None:
    dash_first = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64 of 0xF8.. starts "-"
    draws: Iterator[uuid.UUID] = iter([dash_first, dash_first, uuid.UUID(int=1)])
    cluster_id = kp.new_cluster_id(lambda: next(draws))
    assert not cluster_id.startswith("-")
    assert base64.urlsafe_b64decode(cluster_id + "==") == uuid.UUID(int=1).bytes


def test_cluster_ids_differ() -> None:
    assert len({kp.new_cluster_id() for _ in range(50)}) == 50


def test_single_node_kraft_roles_and_listeners(tmp_path: Path) -> None:
    props = _props(tmp_path)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:39093"
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:39092,CONTROLLER://127.0.0.1:39093"
    )
    assert props["advertised.listeners"] == props["listeners"]
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path / "data")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("offsets.topic.replication.factor", "1"),
        ("offsets.topic.num.partitions", "1"),
        ("transaction.state.log.replication.factor", "1"),
        ("transaction.state.log.min.isr", "1"),
        ("share.coordinator.state.topic.replication.factor", "1"),
        ("default.replication.factor", "1"),
        ("min.insync.replicas", "1"),
        ("num.partitions", "1"),
        ("group.initial.rebalance.delay.ms", "0"),
        ("auto.create.topics.enable", "true"),
        ("log.cleaner.enable", "true"),
        ("log.cleaner.dedupe.buffer.size", "8388608"),
        ("num.io.threads", "2"),
    ],
)
def test_single_node_settings(tmp_path: Path, key: str, value: str) -> None:
    assert _props(tmp_path)[key] == value


def test_render_then_parse_round_trips(tmp_path: Path) -> None:
    props = _props(tmp_path)
    text = kp.render_properties(props)
    assert text.endswith("\n")
    assert text.startswith("#")
    assert kp.parse_properties(text) == props


def test_render_rejects_newlines() -> None:
    with pytest.raises(ConfigError):
        kp.render_properties({"listeners": "a\nb"})


def test_parse_skips_comments_and_blank_lines() -> None:
    text = "# c\n! also\n\n a = b=c \nnoequals\n"
    assert kp.parse_properties(text) == {"a": "b=c"}


def test_ports_round_trip_through_listeners(tmp_path: Path) -> None:
    assert kp.ports_from_properties(_props(tmp_path)) == PORTS


def test_ports_need_both_listeners() -> None:
    with pytest.raises(ConfigError, match="delete the broker work folder"):
        kp.ports_from_properties({"listeners": "PLAINTEXT://127.0.0.1:1"})


def test_jvm_flags(tmp_path: Path) -> None:
    flags = kp.jvm_flags(512, tmp_path / "logs", tmp_path / "log4j2.properties")
    assert "-Xmx512m" in flags
    assert "-Xms256m" in flags
    assert "-XX:+UseSerialGC" in flags
    assert f"-Dkafka.logs.dir={tmp_path / 'logs'}" in flags
    assert f"-Dlog4j2.configurationFile={tmp_path / 'log4j2.properties'}" in flags


def test_jvm_flags_small_heap(tmp_path: Path) -> None:
    assert "-Xms200m" in kp.jvm_flags(200, tmp_path, tmp_path)
    with pytest.raises(ConfigError):
        kp.jvm_flags(64, tmp_path, tmp_path)


def test_tail_lines(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert kp.tail_lines(log, 3) == "line 97\nline 98\nline 99"
    assert "cannot read" in kp.tail_lines(tmp_path / "missing.log")


def test_jar_marker(tmp_path: Path) -> None:
    assert not kp.jars_ready(tmp_path, "abc")
    with pytest.raises(BrokerError, match="no kafka_2.13 jar"):
        kp.write_marker(tmp_path, "abc")
    for name in ("kafka_2.13-4.1.1.jar", "kafka-clients-4.1.1.jar"):
        (tmp_path / name).write_bytes(b"")
    assert kp.write_marker(tmp_path, "abc") == [
        "kafka-clients-4.1.1.jar",
        "kafka_2.13-4.1.1.jar",
    ]
    assert kp.jars_ready(tmp_path, "abc")
    assert not kp.jars_ready(tmp_path, "other-pom")
    (tmp_path / "kafka-clients-4.1.1.jar").unlink()
    assert not kp.jars_ready(tmp_path, "abc")


def test_cli_state_without_file(tmp_path: Path) -> None:
    state = kp.read_state(tmp_path)
    assert state == {}
    assert kp.live_pid({"pid": 2**22 + 1}, tmp_path) is None
