"""Config precedence (flags > env > file) and secret masking."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mycroft.errors import ConfigError
from mycroft.producers.agent.cli import load_settings
from mycroft.producers.agent.config import MASK, kafka_from_env, masked


def _file(tmp_path: Path) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(
        '[agent]\njob_id = "from-file"\ninterval_ms = 50\nbootstrap = "file:9092"\n'
        '[agent.kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.password" = "filepw"\n'
    )
    return p


def test_flags_win_over_env_over_file(tmp_path: Path) -> None:
    env = {
        "MYCROFT_JOB_ID": "from-env",
        "MYCROFT_INTERVAL_MS": "75",
        "MYCROFT_KAFKA__SASL_PASSWORD": "envpw",
        "MYCROFT_KAFKA__SASL_MECHANISM": "PLAIN",
    }
    s = load_settings(
        [
            "--config",
            str(_file(tmp_path)),
            "--job-id",
            "from-flag",
            "--kafka-option",
            "sasl.username=alice",
        ],
        env,
    )
    assert (
        s.job_id == "from-flag" and s.interval_ms == 75 and s.bootstrap == "file:9092"
    )
    assert s.kafka == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "envpw",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
    }
    assert s.kafka_config()["sasl.password"] == "envpw"  # passed through unmasked


def test_secrets_are_masked_in_the_logged_settings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = load_settings(
        ["--config", str(_file(tmp_path)), "--kafka-option", "ssl.key.password=sslpw"],
        {},
    )
    red = s.redacted()
    assert (
        red["kafka"]["sasl.password"] == MASK
        and red["kafka"]["ssl.key.password"] == MASK
    )
    assert red["kafka"]["security.protocol"] == "SASL_SSL"
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("settings: %s", red)
    assert "filepw" not in caplog.text and "sslpw" not in caplog.text


def test_masking_and_env_mapping() -> None:
    assert masked({"sasl.oauthbearer.client.secret": "x", "acks": "all"}) == {
        "sasl.oauthbearer.client.secret": MASK,
        "acks": "all",
    }
    env = {"MYCROFT_KAFKA__SSL_CA_LOCATION": "/ca", "HOME": "/root"}
    assert kafka_from_env(env) == {"ssl.ca.location": "/ca"}


def test_older_and_sectioned_variables(tmp_path: Path) -> None:
    s = load_settings([], {"MYCROFT_INTERVAL_MS": "75", "MYCROFT_AGENT__JOB_ID": "j"})
    assert (s.interval_ms, s.job_id) == (75, "j")
    with pytest.raises(ConfigError, match="MYCROFT_HEARTBEAT_S='x': heartbeat_s"):
        load_settings([], {"MYCROFT_HEARTBEAT_S": "x"})
    path = tmp_path / "a.toml"
    path.write_text("[agent]\nbogus = 1\n")
    with pytest.raises(ConfigError, match="unknown bogus"):
        load_settings(["--config", str(path)], {})


@pytest.mark.parametrize(
    "argv",
    [
        ["--source", "nope"],
        ["--interval-ms", "0"],
        ["--source", "replay"],
        ["--kafka-option", "novalue"],
    ],
)
def test_bad_settings_raise_config_error(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        load_settings(argv, {})


def test_sim_source_needs_simulator_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sim_args"):
        load_settings(["--source", "sim", "--spool-dir", str(tmp_path)], {})
