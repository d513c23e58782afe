"""The one rule for a missing service in tests: skip locally, fail in CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

_FALSY = {"", "0", "false", "no", "off"}


def in_ci() -> bool:
    """Whether ``CI`` is set to a truthy value."""
    return os.environ.get("CI", "").strip().lower() not in _FALSY


def unavailable(service: str, reason: str) -> NoReturn:
    """Integration tests must run in CI: fail there, skip elsewhere."""
    if in_ci():
        pytest.fail(f"{service} unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"no {service} (skipped outside CI only): {reason}")
