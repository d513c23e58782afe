"""Settings of the stream worker: flags, environment, validation."""

from __future__ import annotations

import pytest

from mycroft.errors import ConfigError
from mycroft.streams.app import faust_config, main
from mycroft.streams.faust_settings import StreamSettings, parse_settings, to_argv
from mycroft.streams.faust_topics import tick_topic


def test_flags_win_over_environment() -> None:
    env = {
        "MYCROFT_STREAMS__BOOTSTRAP": "envhost:1",
        "MYCROFT_STREAMS__PARTITIONS": "4",
        "MYCROFT_STREAMS__RATES": "off",
        "MYCROFT_STREAMS__APP_ID": "from-env",
    }
    cmd, s = parse_settings(
        ["worker", "--bootstrap", "a:9092,b:9093", "--app-id", "x1"], env
    )
    assert cmd == "worker"
    assert (s.bootstrap, s.app_id, s.partitions, s.rates) == (
        "a:9092,b:9093",
        "x1",
        4,
        False,
    )


def test_defaults_and_faust_config() -> None:
    s = StreamSettings("h:1", web_port=0, data_dir="/tmp/d")
    cfg = faust_config(s)
    assert cfg["broker"] == ["kafka://h:1"] and cfg["web_enabled"] is False
    assert cfg["topic_partitions"] == 8 and cfg["store"] == "memory://"
    assert cfg["broker_commit_every"] >= 10**9  # commits follow snapshots only
    assert tick_topic(s) == "mycroft-streams-tick"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bootstrap": ""},
        {"bootstrap": "nohost"},
        {"bootstrap": "h:1", "app_id": "bad id"},
        {"bootstrap": "h:1", "partitions": 0},
        {"bootstrap": "h:1", "evaluate_interval_s": 0},
        {"bootstrap": "h:1", "snapshot_interval_s": 0.05},
        {"bootstrap": "h:1", "web_port": 80},
        {"bootstrap": "h:1", "session_timeout_s": 1},
        {"bootstrap": "h:1", "loglevel": "loud"},
        {"bootstrap": "h:1", "prefix": "a b"},
        {"bootstrap": "h:1", "stats_interval_s": 0},
        {"bootstrap": "h:1", "trace_speed": 0},
    ],
)
def test_invalid_settings_raise_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        StreamSettings(**kwargs)  # type: ignore[arg-type]


def test_missing_bootstrap_and_bad_env_value() -> None:
    with pytest.raises(ConfigError, match="bootstrap"):
        parse_settings(["worker"], {})
    with pytest.raises(ConfigError, match="PARTITIONS"):
        parse_settings(
            ["worker"],
            {
                "MYCROFT_STREAMS__BOOTSTRAP": "h:1",
                "MYCROFT_STREAMS__PARTITIONS": "many",
            },
        )


def test_main_reports_config_errors_with_exit_code_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["worker", "--bootstrap", "nohost"]) == 2
    assert "bootstrap" in capsys.readouterr().err


def test_worker_flags_read_back_as_the_same_settings() -> None:
    s = StreamSettings("h:1", partitions=4, rates=False, trace_speed=0.25, stage="comm")
    assert parse_settings(to_argv(s), env={}) == ("worker", s)
