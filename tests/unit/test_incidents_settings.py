"""`mycroft incidents` settings: flag > environment > [incidents] table > default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mycroft.errors import ConfigError
from mycroft.incidents import _parser, load_settings


def _flags(*argv: str) -> dict[str, Any]:
    return vars(_parser().parse_args(["list", *argv]))


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "mycroft.toml"
    path.write_text(
        '[incidents]\nbootstrap = "file:9092"\ntopic_prefix = "f."\ntimeout = 5.0\n'
    )
    return path


def test_defaults_without_any_layer() -> None:
    s = load_settings(_flags(), {})
    assert (s.bootstrap, s.topic_prefix, s.timeout) == ("", "", 30.0)


def test_file_then_environment_then_flag(tmp_path: Path) -> None:
    env = {"MYCROFT_CONFIG": str(_config(tmp_path))}
    s = load_settings(_flags(), env)
    assert (s.bootstrap, s.topic_prefix, s.timeout) == ("file:9092", "f.", 5.0)
    env |= {"MYCROFT_INCIDENTS__BOOTSTRAP": "env:9092", "MYCROFT_TOPIC_PREFIX": "e."}
    s = load_settings(_flags(), env)
    assert (s.bootstrap, s.topic_prefix, s.timeout) == ("env:9092", "e.", 5.0)
    s = load_settings(_flags("--bootstrap", "flag:9092", "--timeout", "7"), env)
    assert (s.bootstrap, s.topic_prefix, s.timeout) == ("flag:9092", "e.", 7.0)


def test_bad_values_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MYCROFT_INCIDENTS__TTL='x'"):
        load_settings(_flags(), {"MYCROFT_INCIDENTS__TTL": "x"})
    path = tmp_path / "bad.toml"
    path.write_text('[incidents]\ntimeout = "soon"\n')
    with pytest.raises(ConfigError, match="bad.toml"):
        load_settings(_flags(), {"MYCROFT_CONFIG": str(path)})
    with pytest.raises(ConfigError, match="timeout"):
        load_settings(_flags("--timeout", "0"), {})
