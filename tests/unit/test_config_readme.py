"""The README's example config file loads through each command's own loader."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from mycroft import admin, incidents
from mycroft.producers.agent.cli import load_settings as agent_settings
from mycroft.sinks.service import load_settings as sinks_settings
from mycroft.streams.faust_settings import parse_settings

README = Path(__file__).parents[2] / "README.md"


def _example(tmp_path: Path) -> tuple[Path, dict[str, dict[str, object]]]:
    text = README.read_text().split("### Configuration", 1)[1]
    block = re.search(r"```toml\n(.*?)```", text, re.S)
    assert block, "README: the Configuration section has no toml example"
    path = tmp_path / "mycroft.toml"
    path.write_text(block.group(1))
    return path, tomllib.loads(block.group(1))


def test_readme_example_loads_in_every_section(tmp_path: Path) -> None:
    path, tables = _example(tmp_path)
    assert set(tables) == {"agent", "streams", "sinks", "topics", "incidents"}
    env = {"MYCROFT_CONFIG": str(path)}
    loaded = {
        "agent": agent_settings([], env),
        "streams": parse_settings(["worker"], env)[1],
        "sinks": sinks_settings([], env),
        "topics": admin.load_settings(
            vars(admin._parser().parse_args(["create"])), env
        ),
        "incidents": incidents.load_settings(
            vars(incidents._parser().parse_args(["list"])), env
        ),
    }
    for section, values in tables.items():
        for key, value in values.items():
            assert getattr(loaded[section], key) == value, (section, key)
