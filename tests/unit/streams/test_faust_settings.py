"""Settings of the stream worker: flags, environment, validation."""

from __future__ import annotations

import pytest

from mycroft.errors import ConfigError
from mycroft.streams.app import default_engine_factory, faust_config, main
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.evidence import Rule
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
        {"bootstrap": "h:1", "detector": "hang_min_s"},
        {"bootstrap": "h:1", "detector": "no_such_key=1"},
        {"bootstrap": "h:1", "detector": "slow_persist=9"},
        {"bootstrap": "h:1", "detector": "rca.max_culprits=0"},
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


def test_detector_overrides_reach_the_engines_from_flag_env_and_defaults() -> None:
    _, flag = parse_settings(
        ["worker", "--bootstrap", "h:1", "--detector", "hang_min_s=2,slow_of=6"], {}
    )
    env = {"MYCROFT_STREAMS__DETECTOR": "rca.weight.slow_compute=2"}
    _, rca = parse_settings(["worker", "--bootstrap", "h:1"], env)
    assert rca.detector_config().rca.weight(Rule.SLOW_COMPUTE) == 2.0
    assert flag.detector_config().hang_min_s == 2.0
    assert flag.detector_config().slow_of == 6
    env = {"MYCROFT_STREAMS__DETECTOR": "incident_quiet_s=9"}
    _, from_env = parse_settings(["worker", "--bootstrap", "h:1"], env)
    assert from_env.detector_config().incident_quiet_s == 9.0
    _, plain = parse_settings(["worker", "--bootstrap", "h:1"], {})
    assert plain.detector_config() == DetectorConfig()
    engine = default_engine_factory("single", 8, flag.detector_config())("job")
    assert isinstance(engine, Analyzer) and engine.cfg.hang_min_s == 2.0
    # a child worker started from these settings reads the same overrides
    assert parse_settings(to_argv(flag), {})[1].detector == flag.detector
