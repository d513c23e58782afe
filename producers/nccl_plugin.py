"""Where Mycroft's NCCL profiler plugin is built, and ``mycroft nccl-plugin``.

The plugin is C (``producers/nccl/``), built by ``make -C producers/nccl``
(``./dev setup`` runs it). ``MYCROFT_NCCL_BUILD`` names another build
directory. Point NCCL at it with ``NCCL_PROFILER_PLUGIN=$(mycroft nccl-plugin path)``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mycroft.cli_parser import mycroft_parser

LIBRARY = "libnccl-profiler-mycroft.so"
SOURCE_DIR = Path(__file__).resolve().parent / "nccl"
"""The plugin's sources (present in a source checkout, not in the wheel)."""


def build_dir() -> Path:
    """Directory holding the built plugin and its test programs."""
    env = os.environ.get("MYCROFT_NCCL_BUILD")
    return Path(env) if env else SOURCE_DIR / "build"


def plugin_path() -> Path:
    """Path of the built ``.so``.

    Raises:
        FileNotFoundError: it was not built; the message says how to build it.
    """
    path = build_dir() / LIBRARY
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: build it with 'make -C {SOURCE_DIR}' "
            "(or ./dev setup); it needs a C compiler and make"
        )
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``mycroft nccl-plugin path``: print the built plugin's path."""
    parser = mycroft_parser(
        "nccl-plugin",
        "Mycroft's NCCL profiler plugin: a shared library NCCL loads "
        "(NCCL_PROFILER_PLUGIN=PATH) that writes each flow's progress to the "
        "trace ring the node agent drains.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser(
        "path",
        help="print the built plugin (the value for NCCL_PROFILER_PLUGIN)",
        description="Print the built plugin's path, the value for "
        "NCCL_PROFILER_PLUGIN.",
    )
    parser.parse_args(argv)
    try:
        print(plugin_path())
    except FileNotFoundError as exc:
        print(f"mycroft nccl-plugin: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
