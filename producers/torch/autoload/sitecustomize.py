"""Opt-in hook: put this folder on PYTHONPATH and set MYCROFT_TORCH_TRACE=1.

``python -m mycroft.producers.torch.run --hook-dir`` prints the folder. It
shadows any other ``sitecustomize`` on the path; that one is run afterwards.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _chain() -> None:
    here = Path(__file__).resolve().parent
    for entry in sys.path:
        if not entry or Path(entry).resolve() == here:
            continue
        cand = Path(entry) / "sitecustomize.py"
        if cand.is_file():
            spec = importlib.util.spec_from_file_location("_site_next", cand)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


try:
    from mycroft.producers.torch import install_from_env

    install_from_env()
except ImportError as exc:  # mycroft not installed in this interpreter
    print(f"mycroft: torch tracing hook inactive: {exc}", file=sys.stderr)
_chain()
