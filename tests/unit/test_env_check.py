"""One naming scheme for every command's variables, and a word on typos."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mycroft.cli import main as cli_main
from mycroft.env_check import FAMILIES, known_variables, unknown_variables
from mycroft.kafka_security import env_prefixes, security_from

ROOT = Path(__file__).parents[2]
SOURCES = ("mycroft", "streams", "sinks", "producers", "infra", "schemas")
SUFFIXES = {".py", ".c", ".h", ".sh"}
NAME = re.compile(r"\bMYCROFT_[A-Z0-9_]*[A-Z0-9]\b")


def test_the_documented_form_is_read_first_then_the_shared_one() -> None:
    env = {
        "MYCROFT_SINKS__SECURITY_PROTOCOL": "SSL",
        "MYCROFT_SECURITY_PROTOCOL": "SASL_SSL",
        "MYCROFT_SASL_USERNAME": "shared",
    }
    sec = security_from({}, env, env_prefixes("sinks"))
    assert (sec.protocol, sec.username) == ("SSL", "shared")
    sec = security_from({}, env | {"MYCROFT_SASL_PASSWORD": "p"}, env_prefixes("x"))
    assert sec.protocol == "SASL_SSL"


@pytest.mark.parametrize("section", ["agent", "streams", "sinks", "topics",
                                     "incidents", "replay"])  # fmt: skip
def test_every_command_knows_both_forms_of_its_security(section: str) -> None:
    known = known_variables()
    for name in ("SECURITY_PROTOCOL", "SASL_PASSWORD", "KAFKA_SECURITY_FILE"):
        assert f"MYCROFT_{section.upper()}__{name}" in known
        assert f"MYCROFT_{name}" in known


def test_a_form_no_command_reads_is_warned_about() -> None:
    """A section no command has (a misspelled command name) is named."""
    (line,) = unknown_variables({"MYCROFT_AGNET__SECURITY_PROTOCOL": "SSL"})
    assert "unknown variable MYCROFT_AGNET__SECURITY_PROTOCOL" in line
    assert unknown_variables({"MYCROFT_AGENT__SECURITY_PROTOCOL": "SSL"}) == []


def test_an_unknown_variable_names_the_closest_known_one() -> None:
    assert unknown_variables({"MYCROFT_STREAMS__PARTITONS": "8"}) == [
        "mycroft: ignoring unknown variable MYCROFT_STREAMS__PARTITONS; "
        "did you mean MYCROFT_STREAMS__PARTITIONS?"
    ]
    assert unknown_variables({"MYCROFT_ZZZ": "1"}) == [
        "mycroft: ignoring unknown variable MYCROFT_ZZZ"
    ]
    assert unknown_variables({"MYCROFT_NCCL_TICK_MS": "5", "PATH": "/bin"}) == []


def test_every_variable_the_code_reads_is_known() -> None:
    """A variable read anywhere in the source tree is never warned about
    (prefixes such as ``MYCROFT_STREAMS__`` and C include guards aside)."""
    used: set[str] = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in SUFFIXES and path.name != "env_check.py":
                used |= set(NAME.findall(path.read_text()))
    missing = sorted(
        name for name in used - known_variables()
        if not name.startswith(FAMILIES) and not name.endswith("_H")
    )  # fmt: skip
    assert missing == [], missing


def test_the_command_warns_once_on_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MYCROFT_INCIDENTS__BOOTSTRAPP", "x:1")
    assert cli_main(["topics", "list"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "mycroft: ignoring unknown variable MYCROFT_INCIDENTS__BOOTSTRAPP; "
        "did you mean MYCROFT_INCIDENTS__BOOTSTRAP?"
    ]
