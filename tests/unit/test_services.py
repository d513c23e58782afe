"""A missing service skips a test locally and fails it in CI."""

from __future__ import annotations

import pytest

from tests.services import unavailable


def test_missing_service_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="Kafka unavailable in CI: down"):
        unavailable("Kafka", "down")


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_missing_service_skips_outside_ci(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match="outside CI only"):
        unavailable("Kafka", "down")
