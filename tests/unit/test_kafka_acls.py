"""ACLs of each role, and the secured broker's properties (no Java needed)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from confluent_kafka.admin._acl import AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from mycroft.errors import ConfigError
from mycroft.infra import _kafka_props as kp
from mycroft.infra.kafka_acls import Grant, role_acls
from mycroft.infra.kafka_security import SecureKafkaBroker, User, cli_broker
from mycroft.topics import TopicSet

TOPICS = TopicSet("p.")
RAW = {TOPICS.topology, TOPICS.state, TOPICS.completion, TOPICS.heartbeat}
Rule = tuple[str, str, str, str]  # kind, name, pattern, operation


def rules(grant: Grant) -> set[Rule]:
    bindings = role_acls(grant, TOPICS)
    assert len(bindings) == len(set(bindings))
    assert {b.permission_type for b in bindings} == {AclPermissionType.ALLOW}
    assert {b.principal for b in bindings} == {f"User:{grant.username}"}
    return {
        (b.restype.name, b.name, b.resource_pattern_type.name, b.operation.name)
        for b in bindings
    }


def on(kind: ResourceType, names: set[str], *ops: AclOperation) -> set[Rule]:
    pattern = ResourcePatternType.LITERAL.name
    return {(kind.name, n, pattern, op.name) for n in names for op in ops}


def test_agent_only_writes_raw() -> None:
    write, describe = AclOperation.WRITE, AclOperation.DESCRIBE
    assert rules(Grant("a", "agent")) == on(ResourceType.TOPIC, RAW, write, describe)


def test_subscriber_only_reads_root_causes() -> None:
    got = rules(Grant("s", "subscriber", "subs"))
    read, describe = AclOperation.READ, AclOperation.DESCRIBE
    assert got == on(ResourceType.TOPIC, {TOPICS.rootcause}, read, describe) | {
        ("GROUP", "subs", "PREFIXED", "READ")
    }


def test_worker_reads_raw_writes_results_and_owns_its_prefix() -> None:
    got = rules(Grant("w", "worker", "app"))
    writes = {r[1] for r in got if r[0] == "TOPIC" and r[3] == "WRITE"}
    reads = {r[1] for r in got if r[0] == "TOPIC" and r[3] == "READ"}
    assert RAW.isdisjoint(writes)
    assert {TOPICS.anomaly, TOPICS.rootcause, TOPICS.deadletter} <= writes
    assert RAW <= reads
    assert {
        ("TOPIC", "app", "PREFIXED", "ALL"),
        ("GROUP", "app", "PREFIXED", "ALL"),
    } <= got


def test_sinks_read_results_and_describe_the_watched_groups() -> None:
    got = rules(Grant("k", "sinks", "sinks-g", ("app",)))
    writes = {r[1] for r in got if r[3] == "WRITE"}
    assert writes == {TOPICS.deadletter}
    assert ("GROUP", "app", "LITERAL", "DESCRIBE") in got
    assert ("GROUP", "sinks-g", "LITERAL", "READ") in got
    raw_reads = {r[1] for r in got if r[1] in RAW and r[3] == "READ"}
    assert raw_reads == {TOPICS.heartbeat}  # job liveness; no state or completion


@pytest.mark.parametrize(("role", "group"), [("nobody", "g"), ("worker", "")])
def test_bad_grants_are_config_errors(role: str, group: str) -> None:
    with pytest.raises(ConfigError):
        Grant("u", role, group)


_OPENSSL_MISSING_OUTSIDE_CI = shutil.which("openssl") is None and not os.environ.get(
    "CI"
)


@pytest.mark.skipif(_OPENSSL_MISSING_OUTSIDE_CI, reason="needs openssl")
def test_secure_properties_and_scram_arguments(tmp_path: Path) -> None:
    user = User.of("a", "agent")
    broker = SecureKafkaBroker([user], TOPICS, tmp_path / "b")
    ports = kp.BrokerPorts(19092, 19093)
    props = broker._server_properties(ports, tmp_path / "data")
    assert props["listeners"].startswith("SASL_SSL://127.0.0.1:19092,CONTROLLER")
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert broker._ports_from(props) == ports
    args = broker._format_args()
    assert args.count("--add-scram") == 2
    assert f"SCRAM-SHA-512=[name=a,password={user.password.reveal()}]" in args
    assert (tmp_path / "b" / "tls" / "ca.pem").stat().st_mode & 0o077 == 0
    with pytest.raises(ConfigError):
        SecureKafkaBroker([user, user], TOPICS, tmp_path / "c")


def test_cli_broker_reuses_the_saved_passwords(tmp_path: Path) -> None:
    clients = tmp_path / "b" / "clients"
    clients.mkdir(parents=True)
    for name in ("admin", "agent"):
        (clients / f"{name}.json").write_text(
            json.dumps({"sasl_password": f"pw-{name}"})
        )
    broker = cli_broker(tmp_path / "b", "p.")
    assert broker.admin_password.reveal() == "pw-admin"
    assert broker.users["agent"].password.reveal() == "pw-agent"
    assert broker.users["streams"].password.reveal() not in {"", "pw-agent"}
    assert {u.grant.role for u in broker.users.values()} == {
        "agent",
        "worker",
        "sinks",
        "subscriber",
    }
