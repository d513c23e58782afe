"""Each principal over SASL_SSL on a secured broker: its job works, nothing else.

One :class:`SecureKafkaBroker` for the module (TLS certificate made at test
time, SCRAM-SHA-512 users, StandardAuthorizer ACLs). The node agent's
credential produces raw records (a ``mycroft agent`` process, and the
publisher a scripted faulty job goes through); a ``mycroft streams worker``
process with the worker's credential reads them and writes the root cause;
the subscriber's credential reads it. Outside their roles they are refused:
an agent cannot forge a root cause, a subscriber cannot read raw records, a
wrong password or a plaintext client gets nowhere. No password appears in
the processes' logs.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from mycroft.errors import MycroftError
from mycroft.incidents import IncidentsSettings, Request
from mycroft.incidents import run as run_incidents
from mycroft.infra.kafka_security import SecureKafkaBroker, User
from mycroft.kafka_client import DecodingConsumer, RecordPublisher
from mycroft.kafka_security import KafkaSecurity, Secret
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Heartbeat, RootCause, StateBatch
from mycroft.sinks.lag import LagMonitor
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.faust_topics import ensure_topics
from mycroft.streams.worker_process import WorkerProcess
from mycroft.topics import TopicSet
from tests.integration.test_streams_e2e import job_records
from tests.services import unavailable

pytestmark = pytest.mark.integration

PREFIX = "sec."
PARTITIONS = 2
APP_ID = "sec-streams"
SUB_GROUP = "subscribers"
SINKS_GROUP = "sec-sinks"
TOPICS = TopicSet(PREFIX, PARTITIONS)


@pytest.fixture(scope="module")
def broker() -> Iterator[SecureKafkaBroker]:
    users = [
        User.of("agent-node", "agent"),
        User.of("streams", "worker", APP_ID),
        User.of("dashboard", "subscriber", SUB_GROUP),
        User.of("sinks", "sinks", SINKS_GROUP, watched_groups=(APP_ID,)),
    ]
    secured = SecureKafkaBroker(users, TOPICS)
    try:
        secured.start()
    except MycroftError as exc:
        secured.close()
        unavailable("secured Kafka broker", str(exc))
    settings = StreamSettings(
        secured.bootstrap, app_id=APP_ID, prefix=PREFIX, partitions=PARTITIONS,
        security=secured.client("admin"),
    )  # fmt: skip
    ensure_topics(settings)  # the super user creates every topic
    yield secured
    secured.close()


def passwords(broker: SecureKafkaBroker) -> list[str]:
    users = [broker.admin_password, *(u.password for u in broker.users.values())]
    return [p.reveal() for p in users]


def conf(broker: SecureKafkaBroker, user: str, **extra: Any) -> dict[str, Any]:
    return (
        {"bootstrap.servers": broker.bootstrap}
        | broker.client(user).librdkafka()
        | extra
    )


def produce_one(config: dict[str, Any], topic: str) -> KafkaError | None:
    """Produce one record; return the delivery error (None: delivered)."""
    result: list[KafkaError | None] = []
    producer = Producer(config | {"message.timeout.ms": 10_000})
    producer.produce(
        topic, b"forged", b"job", on_delivery=lambda e, _m: result.append(e)
    )
    producer.flush(15)
    assert result, "no delivery report"
    return result[0]


def consume_error(config: dict[str, Any], topic: str) -> KafkaError | None:
    """Subscribe to ``topic`` and return the first error the consumer reports."""
    consumer = Consumer(config | {"auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is not None:
                return msg.error()
    finally:
        consumer.close()
    return None


def test_agent_cli_publishes_over_sasl_ssl(
    broker: SecureKafkaBroker, tmp_path: Path
) -> None:
    agent = broker.client("agent-node")
    password_file = tmp_path / "agent.password"
    password_file.write_text(agent.password.reveal() + "\n")
    truth = tmp_path / "truth.json"
    sim = f"--ranks 8 --tp 8 --duration 2 --seed 3 --truth {truth}"
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "mycroft", "agent", "--source", "sim",
             "--sim-args", sim, "--host", "node0000", "--job-id", "job-cli",
             "--bootstrap", broker.bootstrap, "--topic-prefix", PREFIX,
             "--partitions", str(PARTITIONS), "--spool-dir", str(tmp_path / "spool"),
             "--duration-s", "4", "--security-protocol", "SASL_SSL",
             "--sasl-username", agent.username,
             "--sasl-password-file", str(password_file),
             "--ssl-ca-file", agent.ca_file],
            stdout=out, stderr=subprocess.STDOUT, timeout=90, check=False,
        )  # fmt: skip
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    assert not any(p in text for p in passwords(broker))
    stopped = re.search(r"agent stopped: (\d+) sent, 0 left in the spool", text)
    assert stopped and int(stopped.group(1)) > 0, text[-3000:]  # all acknowledged
    consumer = DecodingConsumer(
        broker.bootstrap, f"{SUB_GROUP}-raw-check",
        [TOPICS.state, TOPICS.heartbeat], TOPICS.deadletter,
        extra=broker.client("admin").librdkafka(),
    )  # fmt: skip
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 20
        while seen != {"StateBatch", "Heartbeat"} and time.monotonic() < deadline:
            for _, rec in consumer.poll(0.5):
                if isinstance(rec, StateBatch) and rec.header.job_id == "job-cli":
                    seen.add("StateBatch")
                elif isinstance(rec, Heartbeat) and rec.job_id == "job-cli":
                    seen.add("Heartbeat")
    finally:
        consumer.close()
    assert seen == {"StateBatch", "Heartbeat"}


def test_worker_reads_raw_and_subscriber_reads_its_root_cause(
    broker: SecureKafkaBroker, tmp_path: Path
) -> None:
    settings = StreamSettings(
        broker.bootstrap, app_id=APP_ID, prefix=PREFIX, partitions=PARTITIONS,
        evaluate_interval_s=0.1, snapshot_interval_s=0.5,
        data_dir=str(tmp_path / "data"), security=broker.client("streams"),
    )  # fmt: skip
    worker = WorkerProcess(settings, tmp_path / "worker.log")
    # a subscriber of its own: a plain consumer (DecodingConsumer also
    # produces dead letters, which this role may not)
    subscriber = Consumer(
        conf(broker, "dashboard", **{"group.id": f"{SUB_GROUP}.dash"})
        | {"auto.offset.reset": "earliest"}
    )
    subscriber.subscribe([TOPICS.rootcause])
    codec = Codec()
    try:
        worker.start(timeout_s=90)
        publisher = RecordPublisher(
            broker.bootstrap, TOPICS, extra=broker.client("agent-node").librdkafka()
        )
        for _, rec in job_records("job-sec", "gpu-hang"):
            publisher.publish(rec)
        assert publisher.flush(30) == 0 and publisher.stats.failed == 0
        found: list[RootCause] = []
        deadline = time.monotonic() + 60
        while not found and time.monotonic() < deadline:
            msg = subscriber.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            rec = codec.decode(msg.value() or b"")
            if isinstance(rec, RootCause) and rec.job_id == "job-sec":
                found.append(rec)
        assert found, worker.log()[-3000:]
        assert found[0].kind.value == "hang"
        assert any(c.rank == 3 for c in found[0].culprits)
    finally:
        subscriber.close()
        worker.stop()
    text = worker.log()
    assert not any(p in text for p in passwords(broker))


def test_subscriber_lists_incidents(broker: SecureKafkaBroker) -> None:
    """After the worker test: ``mycroft incidents list`` with the subscriber's
    credential (it may only read the root-cause topic, in groups under its
    prefix, and produce nothing: the reader never dead-letters)."""
    settings = IncidentsSettings(
        broker.bootstrap, topic_prefix=PREFIX, job="job-sec", timeout=60,
        group_prefix=f"{SUB_GROUP}.incidents", security=broker.client("dashboard"),
    )  # fmt: skip
    out = io.StringIO()
    assert run_incidents(settings, Request("list", as_json=True), out) == 0
    rows = json.loads(out.getvalue())["incidents"]
    assert [r["kind"] for r in rows] == ["hang"], out.getvalue()
    assert rows[0]["subject"].startswith("rank 3 "), rows[0]


def test_sinks_read_root_causes_and_the_workers_lag(broker: SecureKafkaBroker) -> None:
    """After the worker test: the sinks' consumer and lag monitor, as the sinks."""
    extra = broker.client("sinks").librdkafka()
    consumer = DecodingConsumer(
        broker.bootstrap, SINKS_GROUP, [TOPICS.anomaly, TOPICS.rootcause],
        TOPICS.deadletter, extra=extra, auto_commit=False,
    )  # fmt: skip
    kinds: set[str] = set()
    try:
        deadline = time.monotonic() + 20
        # both topics: one poll may bring root causes before any anomaly
        while kinds != {"Anomaly", "RootCause"} and time.monotonic() < deadline:
            kinds |= {type(rec).__name__ for _, rec in consumer.poll(0.5)}
        consumer.commit()
    finally:
        consumer.close()
    assert kinds == {"Anomaly", "RootCause"}
    registry = CollectorRegistry()
    raw = [TOPICS.state, TOPICS.completion]
    LagMonitor(broker.bootstrap, [APP_ID], raw, registry, extra=extra).read_once()
    end = registry.get_sample_value("mycroft_topic_end_offset", {"topic": TOPICS.state})
    lag = registry.get_sample_value(
        "mycroft_consumer_lag_records", {"group": APP_ID, "topic": TOPICS.state}
    )
    assert end is not None and end > 0 and lag is not None


def test_agent_cannot_forge_a_root_cause(broker: SecureKafkaBroker) -> None:
    err = produce_one(conf(broker, "agent-node"), TOPICS.rootcause)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_one(conf(broker, "agent-node"), TOPICS.state) is None


def test_agent_cannot_read_raw(broker: SecureKafkaBroker) -> None:
    err = consume_error(conf(broker, "agent-node", **{"group.id": "x"}), TOPICS.state)
    assert err is not None
    assert err.code() in {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    }


def test_subscriber_cannot_read_raw_or_write(broker: SecureKafkaBroker) -> None:
    config = conf(broker, "dashboard", **{"group.id": f"{SUB_GROUP}.raw"})
    err = consume_error(config, TOPICS.state)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    err = produce_one(conf(broker, "dashboard"), TOPICS.rootcause)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_subscriber_group_outside_its_prefix_is_refused(
    broker: SecureKafkaBroker,
) -> None:
    config = conf(broker, "dashboard", **{"group.id": "someone-else"})
    err = consume_error(config, TOPICS.rootcause)
    assert err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_worker_cannot_write_raw(broker: SecureKafkaBroker) -> None:
    err = produce_one(conf(broker, "streams"), TOPICS.heartbeat)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def authentication_error(config: dict[str, Any]) -> str:
    """What a client with ``config`` is told when fetching metadata."""
    errors: list[str] = []
    admin = AdminClient(config | {"error_cb": lambda e: errors.append(e.str())})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # serves error_cb
    return " ".join(errors)


def test_wrong_password_is_refused(broker: SecureKafkaBroker) -> None:
    wrong = dataclasses.replace(broker.client("agent-node"), password=Secret("nope"))
    config = {"bootstrap.servers": broker.bootstrap} | wrong.librdkafka()
    assert "Authentication failed" in authentication_error(config)


def test_plaintext_and_untrusted_clients_are_refused(
    broker: SecureKafkaBroker, tmp_path: Path
) -> None:
    authentication_error({"bootstrap.servers": broker.bootstrap})
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(tmp_path / "k"),
         "-out", str(other_ca), "-days", "1", "-subj", "/CN=other"],
        check=True, capture_output=True,
    )  # fmt: skip
    untrusted = dataclasses.replace(broker.client("agent-node"), ca_file=str(other_ca))
    config = {"bootstrap.servers": broker.bootstrap} | untrusted.librdkafka()
    assert "certificate verify failed" in authentication_error(config)


def test_client_settings_repr_hides_the_password(broker: SecureKafkaBroker) -> None:
    security: KafkaSecurity = broker.client("streams")
    text = f"{security!r} {security} {security.redacted()} {security.to_flags()}"
    assert security.password.reveal() not in text
    assert "*****" in text


def test_no_password_in_the_broker_log(broker: SecureKafkaBroker) -> None:
    text = broker.log_path.read_text("utf-8", "replace")
    assert "Kafka Server started" in text
    assert not any(p in text for p in passwords(broker))
