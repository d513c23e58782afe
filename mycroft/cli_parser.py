"""The argument parser of every ``mycroft`` subcommand.

:func:`mycroft_parser` makes one whose usage reads ``mycroft NAME``, whose
description is a paragraph for the user, and whose options each show their
default on their help line; subcommands made with ``add_subparsers`` inherit
all three (``mycroft broker start``, ``mycroft incidents list``).
"""

from __future__ import annotations

import argparse
from typing import Any


class DefaultsFormatter(argparse.HelpFormatter):
    """Help lines end in ``(default: VALUE)`` unless they already say it.

    An option without a value (``--json``), or whose default is None or
    empty, shows none: there is nothing to say.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default in (None, argparse.SUPPRESS, "", [], ())
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: %(default)s)"


class MycroftParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` with :class:`DefaultsFormatter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def mycroft_parser(
    name: str, description: str, epilog: str | None = None, **kwargs: Any
) -> MycroftParser:
    """The parser of ``mycroft NAME``.

    Args:
        name: the subcommand, ``"sinks"`` (``prog`` is ``mycroft sinks``).
        description: what the command does, one paragraph for its user.
        epilog: text after the options (precedence, examples).
        kwargs: more :class:`argparse.ArgumentParser` arguments.
    """
    return MycroftParser(
        prog=f"mycroft {name}", description=description, epilog=epilog, **kwargs
    )
