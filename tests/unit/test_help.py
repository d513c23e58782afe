"""`mycroft X --help` for every command and subcommand: `mycroft X` usage, and
each option that takes a value shows its default."""

from __future__ import annotations

import argparse
import re

import pytest

from mycroft.cli import COMMANDS, main
from mycroft.cli_parser import DefaultsFormatter


def _help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> tuple[str, argparse.ArgumentParser]:
    """The help text of ``mycroft *argv --help`` and the parser that printed it."""
    shown: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.print_help

    def record(self: argparse.ArgumentParser, file: object = None) -> None:
        shown.append(self)
        original(self)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", record)
    try:
        code = main([*argv, "--help"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out = capsys.readouterr().out
    assert code == 0, (argv, out)
    assert len(shown) == 1, argv
    return out, shown[0]


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]


def _check(out: str, parser: argparse.ArgumentParser, argv: list[str]) -> None:
    usage = " ".join(out.split()).removeprefix("usage: ")
    assert usage.startswith("mycroft " + " ".join(argv)), (argv, out[:200])
    assert parser.formatter_class is DefaultsFormatter, argv
    entries = _option_entries(out)
    for action in parser._actions:
        empty = action.default in (None, argparse.SUPPRESS, "", [], ())
        if not action.option_strings or action.nargs == 0 or empty:
            continue
        entry = entries.get(action.option_strings[-1], "")
        assert "default" in entry, (argv, action.option_strings, entry)


def _option_entries(out: str) -> dict[str, str]:
    """Each option's help entry (its lines joined), by each of its flags."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in out.split("options:", 1)[-1].splitlines():
        if re.match(r"  -", line):
            current = [line.strip()]
        elif line.startswith("   ") and current:
            current.append(line.strip())
        else:
            current = []
            continue
        text = " ".join(current)
        for flag in re.findall(r"(?:^|, )(-{1,2}[\w-]+)", current[0].split("  ")[0]):
            entries[flag] = text
    return entries


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_help_shows_usage_and_defaults(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, parser = _help(monkeypatch, capsys, [name])
    _check(out, parser, [name])
    for sub in _subcommands(parser):
        sub_out, sub_parser = _help(monkeypatch, capsys, [name, sub])
        _check(sub_out, sub_parser, [name, sub])
