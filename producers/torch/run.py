"""``python -m mycroft.producers.torch.run SCRIPT [ARGS]``: run SCRIPT traced.

``--module NAME`` runs a module instead (like ``python -m``); ``--hook-dir``
prints the folder to put on ``PYTHONPATH`` for the ``MYCROFT_TORCH_TRACE=1``
opt-in. Ring settings come from ``MYCROFT_RING_DIR`` and friends (see
``mycroft.producers.torch``).
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from mycroft.producers.torch import install_from_env

HOOK_DIR = Path(__file__).resolve().parent / "autoload"


def main(argv: Sequence[str] | None = None) -> int:
    """Arm the tracer and run the target in this interpreter."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--hook-dir"]:
        print(HOOK_DIR)
        return 0
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    install_from_env(os.environ | {"MYCROFT_TORCH_TRACE": "1"})
    if args[0] == "--module" and len(args) > 1:
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
