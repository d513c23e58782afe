"""A broker that refuses a client is not an outage: each refusal in its words.

One secured broker for the module (SASL_SSL, SCRAM users, ACLs). Every
command that talks to Kafka, run the way a user runs it (``mycroft ...``),
meets a wrong password, a CA it does not trust, a plain-text client on the
TLS listener, a topic and a consumer group its ACLs refuse: each gets one or
two lines saying what to check and the exit code of its class (README, "Exit
codes"), never "cannot reach Kafka ... start a broker"; ``--debug`` adds
librdkafka's own error. The documented variables (``MYCROFT_<SECTION>__*``)
set the security of every command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mycroft.errors import MycroftError
from mycroft.infra.kafka_security import SecureKafkaBroker, User
from mycroft.kafka_client import create_topics
from mycroft.topics import TopicSet
from tests.services import unavailable

pytestmark = pytest.mark.integration

PREFIX = "secerr."
TOPICS = TopicSet(PREFIX, 1)
AUTHENTICATION, TLS, AUTHORIZATION = 7, 8, 9


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The broker's address and one security file per user (and two bad ones)."""
    users = [
        User.of("agent-node", "agent"),
        User.of("dashboard", "subscriber", "mycroft-sub"),
        User.of("sinks", "sinks", "sec-sinks"),
    ]
    broker = SecureKafkaBroker(users, TOPICS)
    try:
        broker.start()
    except MycroftError as exc:
        broker.close()
        unavailable("secured Kafka broker", str(exc))
    folder = tmp_path_factory.mktemp("clients")
    files = {k: str(v) for k, v in broker.write_clients(folder).items()}
    create_topics(broker.bootstrap, TOPICS, extra=broker.client().librdkafka())
    sub = json.loads(Path(files["dashboard"]).read_text())
    wrong = folder / "wrong.json"
    wrong.write_text(json.dumps(sub | {"sasl_password": "not-it"}))
    no_ca = folder / "no-ca.json"
    no_ca.write_text(json.dumps({k: v for k, v in sub.items() if k != "ssl_ca_file"}))
    yield files | {
        "bootstrap": broker.bootstrap, "wrong": str(wrong), "no-ca": str(no_ca),
    }  # fmt: skip
    broker.close()


def mycroft(
    *argv: str, env: dict[str, str] | None = None, timeout_s: float = 90
) -> tuple[int, list[str]]:
    """Run ``mycroft argv``; return its exit code and its stderr lines."""
    done = subprocess.run(
        [sys.executable, "-m", "mycroft", *argv],
        capture_output=True, text=True, timeout=timeout_s, check=False,
        env=os.environ | (env or {}),
    )  # fmt: skip
    return done.returncode, done.stderr.splitlines()


def words(lines: list[str]) -> list[str]:
    """The command's own lines (not log records a daemon writes first)."""
    return [ln for ln in lines if ln.startswith(("mycroft", "  "))]


def check(code: int, lines: list[str], want: int, *parts: str) -> None:
    said = words(lines)
    assert code == want, "\n".join(lines)
    assert 1 <= len(said) <= 2, "\n".join(lines)
    text = "\n".join(said)
    assert "start a broker" not in text and "cannot reach" not in text
    for part in parts:
        assert part in text, text


def common(secured: dict[str, str], command: str) -> list[str]:
    """The arguments ``command`` needs besides its security."""
    b = ["--bootstrap", secured["bootstrap"]]
    return {
        "incidents": ["incidents", "list", *b, "--topic-prefix", PREFIX],
        "topics": ["topics", "create", *b, "--prefix", PREFIX],
        "sinks": ["sinks", *b, "--topic-prefix", PREFIX,
                  "--prometheus-listen", "127.0.0.1:0", "--lag-group", ""],
        "streams": ["streams", "worker", *b, "--prefix", PREFIX],
        "agent": ["agent", "--source", "sim", *b, "--topic-prefix", PREFIX,
                  "--sim-args", "--ranks 8 --tp 8 --duration 1", "--duration-s", "2"],
    }[command]  # fmt: skip


@pytest.mark.parametrize(
    "command", ["incidents", "topics", "sinks", "streams", "agent"]
)
def test_a_wrong_password_is_an_authentication_failure(
    secured: dict[str, str], command: str, tmp_path: Path
) -> None:
    argv = [*common(secured, command), "--kafka-security-file", secured["wrong"]]
    if command == "agent":
        argv += ["--spool-dir", str(tmp_path / "spool")]
    check(*mycroft(*argv), AUTHENTICATION, "refused the SASL login of user "
          "'dashboard' (SCRAM-SHA-512)", "--sasl-password-file")  # fmt: skip


def test_debug_shows_librdkafkas_own_error(secured: dict[str, str]) -> None:
    argv = common(secured, "incidents") + ["--kafka-security-file", secured["wrong"]]
    code, lines = mycroft("--debug", *argv)
    assert code == AUTHENTICATION
    assert any(
        "librdkafka: _AUTHENTICATION" in ln and "invalid credentials" in ln
        for ln in lines
    ), lines


def test_an_untrusted_certificate_is_a_tls_failure(secured: dict[str, str]) -> None:
    argv = common(secured, "incidents") + ["--kafka-security-file", secured["no-ca"]]
    check(*mycroft(*argv), TLS, "cannot verify the TLS certificate",
          "the system trust store", "--ssl-ca-file")  # fmt: skip


@pytest.mark.parametrize("command", ["incidents", "topics", "replay", "simulate"])
def test_a_plaintext_client_on_the_tls_listener_is_a_tls_failure(
    secured: dict[str, str], command: str, tmp_path: Path
) -> None:
    b = secured["bootstrap"]
    argv = {
        "replay": ["replay", str(tmp_path / "none.trace"), "--bootstrap", b],
        "simulate": ["simulate", "--ranks", "8", "--tp", "8", "--duration", "1",
                     "--truth", str(tmp_path / "t.json"), "--bootstrap", b],
    }.get(command) or common(secured, command)  # fmt: skip
    hint = "mycroft replay" if command == "simulate" else "--security-protocol SASL_SSL"
    check(*mycroft(*argv), TLS, "expects TLS", "(PLAINTEXT)", hint)


def test_a_topic_outside_the_users_acls_is_an_authorization_failure(
    secured: dict[str, str],
) -> None:
    """The agent's user may not read the incidents, nor create topics."""
    agent = ["--kafka-security-file", secured["agent-node"]]
    check(*mycroft(*common(secured, "incidents"), *agent), AUTHORIZATION,
          "does not allow user 'agent-node'", "TOPIC_AUTHORIZATION_FAILED",
          "infra/SECURITY.md")  # fmt: skip
    check(*mycroft(*common(secured, "topics"), "--prefix", "other.", *agent),
          AUTHORIZATION, "AUTHORIZATION_FAILED")  # fmt: skip


def test_a_group_outside_the_users_acls_is_an_authorization_failure(
    secured: dict[str, str],
) -> None:
    argv = common(secured, "sinks") + [
        "--group", "someone-else", "--kafka-security-file", secured["sinks"],
    ]  # fmt: skip
    check(*mycroft(*argv), AUTHORIZATION, "does not allow user 'sinks' the "
          "consumer group", "GROUP_AUTHORIZATION_FAILED", "--group")  # fmt: skip


def test_replay_refused_a_topic_says_so(
    secured: dict[str, str], tmp_path: Path
) -> None:
    trace = tmp_path / "run.trace"
    code, _ = mycroft(
        "simulate", "--ranks", "8", "--tp", "8", "--duration", "1",
        "--out", str(trace), "--truth", str(tmp_path / "t.json"),
    )  # fmt: skip
    assert code == 0
    argv = [
        "replay", str(trace), "--bootstrap", secured["bootstrap"],
        "--topic-prefix", PREFIX, "--kafka-security-file", secured["dashboard"],
    ]  # fmt: skip
    check(*mycroft(*argv), AUTHORIZATION, "TOPIC_AUTHORIZATION_FAILED")


@pytest.mark.parametrize(
    ("command", "variable"),
    [
        ("incidents", "MYCROFT_INCIDENTS__KAFKA_SECURITY_FILE"),
        ("sinks", "MYCROFT_SINKS__KAFKA_SECURITY_FILE"),
        ("topics", "MYCROFT_TOPICS__KAFKA_SECURITY_FILE"),
        ("incidents", "MYCROFT_KAFKA_SECURITY_FILE"),
    ],
)
def test_the_documented_variables_set_every_commands_security(
    secured: dict[str, str], command: str, variable: str
) -> None:
    """Set through the environment alone, the wrong credentials are used
    (and refused), so the variable was read; nothing warns about it."""
    code, lines = mycroft(*common(secured, command), env={variable: secured["wrong"]})
    check(code, lines, AUTHENTICATION, "refused the SASL login")
    assert not any("unknown variable" in ln for ln in lines)


def test_a_mistyped_variable_is_named_with_the_closest_one(
    secured: dict[str, str],
) -> None:
    env = {"MYCROFT_SINKS__SECURTY_PROTOCOL": "SASL_SSL"}
    code, lines = mycroft(*common(secured, "incidents"), env=env)
    assert lines[0] == (
        "mycroft: ignoring unknown variable MYCROFT_SINKS__SECURTY_PROTOCOL; "
        "did you mean MYCROFT_SINKS__SECURITY_PROTOCOL?"
    )
    assert code == TLS  # it was ignored: the client spoke plain text
