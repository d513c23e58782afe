"""Kafka client security settings: precedence, validation, and no secret shown."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest

from mycroft.errors import ConfigError
from mycroft.kafka_security import (
    PLAINTEXT,
    KafkaSecurity,
    Secret,
    security_from,
    security_from_argv,
)
from mycroft.producers.agent.cli import load_settings
from mycroft.sinks import service as sinks_service
from mycroft.streams.faust_auth import faust_auth
from mycroft.streams.faust_settings import child_env, parse_settings, to_argv

PASSWORD = "s3cret-Pa55word-xyzzy"


@pytest.fixture
def ca_file(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(tmp_path / "k"),
         "-out", str(path), "-days", "1", "-subj", "/CN=test"],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(path)


@pytest.fixture
def password_file(tmp_path: Path) -> str:
    path = tmp_path / "password"
    path.write_text(PASSWORD + "\n")
    return str(path)


def test_default_is_plaintext_and_renders_nothing() -> None:
    assert security_from({}, {}, "MYCROFT_") == PLAINTEXT
    assert PLAINTEXT.librdkafka() == {} and PLAINTEXT.to_flags() == []
    assert faust_auth(PLAINTEXT) == {}
    _, settings = parse_settings(["worker", "--bootstrap", "h:1"], {})
    assert settings.security == PLAINTEXT
    assert "--security-protocol" not in to_argv(settings)
    assert child_env(settings) == {}


def test_flags_win_over_env_over_file(tmp_path: Path, ca_file: str) -> None:
    file = tmp_path / "sec.toml"
    file.write_text(
        'security_protocol = "SASL_SSL"\nsasl_username = "from-file"\n'
        f'sasl_password = "file-pw"\nssl_ca_file = "{ca_file}"\n'
    )
    env = {"MYCROFT_KAFKA_SECURITY_FILE": str(file), "MYCROFT_SASL_USERNAME": "env"}
    sec = security_from({}, env, "MYCROFT_")
    assert (sec.username, sec.password.reveal(), sec.ca_file) == (
        "env",
        "file-pw",
        ca_file,
    )
    sec = security_from({"sasl_username": "flag"}, env, "MYCROFT_")
    assert sec.username == "flag" and sec.protocol == "SASL_SSL"
    assert sec.librdkafka() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "flag",
        "sasl.password": "file-pw",
        "ssl.ca.location": ca_file,
    }


def test_password_file_flag_wins_over_env(password_file: str) -> None:
    env = {"MYCROFT_STREAMS__SASL_PASSWORD": "env-pw"}
    argv = ["--security-protocol", "SASL_SSL", "--sasl-username", "w"]
    sec = security_from_argv(argv, env, "MYCROFT_STREAMS__")
    assert sec.password.reveal() == "env-pw"
    argv += ["--sasl-password-file", password_file]
    assert (
        security_from_argv(argv, env, "MYCROFT_STREAMS__").password.reveal() == PASSWORD
    )


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"security_protocol": "TLS"}, "not one of"),
        ({"security_protocol": "SASL_SSL"}, "needs a SASL user name"),
        ({"security_protocol": "SASL_SSL", "sasl_username": "u",
          "sasl_password": "p", "sasl_mechanism": "MD5"}, "mechanism"),
        ({"security_protocol": "SSL", "ssl_ca_file": "/nonexistent/ca.pem"}, "CA file"),
    ],
)  # fmt: skip
def test_invalid_settings_are_config_errors(values: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        security_from(values, {}, "MYCROFT_")


def test_a_missing_password_file_error_does_not_show_its_argument() -> None:
    with pytest.raises(ConfigError) as caught:
        security_from({"sasl_password_file": PASSWORD}, {}, "MYCROFT_")
    assert PASSWORD not in str(caught.value)


def test_unknown_key_in_security_file(tmp_path: Path) -> None:
    file = tmp_path / "sec.json"
    file.write_text(json.dumps({"kafka_security": {"sasl_passwd": "x"}}))
    with pytest.raises(ConfigError, match="unknown keys sasl_passwd"):
        security_from({"kafka_security_file": str(file)}, {}, "MYCROFT_")


def test_secret_is_masked_everywhere(
    ca_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    sec = KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "u", Secret(PASSWORD), ca_file)
    logging.getLogger("test").warning("settings %s %r %s", sec, sec, sec.redacted())
    shown = f"{sec} {sec!r} {sec.password} {sec.redacted()} {sec.to_flags()}"
    shown += caplog.text + repr(faust_auth(sec))
    assert PASSWORD not in shown and "*****" in shown


def test_worker_settings_keep_the_password_off_the_command_line(
    password_file: str,
) -> None:
    argv = ["worker", "--bootstrap", "h:1", "--security-protocol", "SASL_SSL",
            "--sasl-username", "w", "--sasl-password-file", password_file]  # fmt: skip
    _, settings = parse_settings(argv, {})
    assert PASSWORD not in f"{settings} {settings!r} {to_argv(settings)}"
    child = child_env(settings)
    assert child == {"MYCROFT_STREAMS__SASL_PASSWORD": PASSWORD}
    _, again = parse_settings(to_argv(settings), child)
    assert again == settings


def test_agent_settings_from_config_file_env_and_flags(
    tmp_path: Path, password_file: str, ca_file: str
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\nbootstrap = "h:1"\nsecurity_protocol = "SASL_SSL"\n'
        f'sasl_username = "node"\nssl_ca_file = "{ca_file}"\n'
    )
    env = {"MYCROFT_SASL_PASSWORD": PASSWORD}
    settings = load_settings(["--config", str(config)], env)
    assert settings.kafka_config()["sasl.password"] == PASSWORD
    assert settings.kafka_config()["sasl.username"] == "node"
    assert PASSWORD not in f"{settings!r} {settings.redacted()}"
    flagged = load_settings(
        ["--config", str(config), "--sasl-username", "other",
         "--sasl-password-file", password_file, "--kafka-option", "sasl.username=opt"],
        {},
    )  # fmt: skip
    assert flagged.security.username == "other"
    assert flagged.kafka_config()["sasl.username"] == "opt"  # --kafka-option wins


def test_help_shows_no_secret(capsys: pytest.CaptureFixture[str]) -> None:
    env = {
        "MYCROFT_SASL_PASSWORD": PASSWORD,
        "MYCROFT_STREAMS__SASL_PASSWORD": PASSWORD,
        "MYCROFT_SASL_USERNAME": PASSWORD,
    }
    texts = []
    for show in (
        lambda: load_settings(["--help"], env),
        lambda: parse_settings(["worker", "--help"], env),
        lambda: sinks_service.load_settings(["--help"], env),
    ):
        with pytest.raises(SystemExit):
            show()
        texts.append(capsys.readouterr().out)
    for text in texts:
        assert "--sasl-password-file" in text and "--security-protocol" in text
        assert PASSWORD not in text
        assert "--sasl-password " not in text  # a password is never a flag


def test_a_ca_file_that_is_not_pem_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="not PEM"):
        KafkaSecurity("SSL", ca_file=str(bad)).ssl_context()
