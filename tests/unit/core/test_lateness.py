"""Host or device: a late rank's issue lag against its start lag."""

from __future__ import annotations

import numpy as np
import pytest

from mycroft.schemas.vocab import Component
from mycroft.streams.core.lateness import LatenessConfig, split_lateness

MS = 1e6
NAN = float("nan")


def lags(issue_ms: list[float], start_ms: list[float]) -> tuple[np.ndarray, np.ndarray]:
    return np.array(issue_ms) * MS, np.array(start_ms) * MS


def test_issued_late_and_started_at_once_is_host() -> None:
    got = split_lateness(*lags([300, 310, 0.1, 290], [0.2, 0.1, 0.0, 0.3]))
    assert got is not None and got.component is Component.HOST
    assert got.late_ops == 3 and got.issue_lag_s == pytest.approx(0.3)
    assert "host side" in got.reason()


def test_issued_on_time_and_started_late_is_gpu() -> None:
    got = split_lateness(*lags([0.1, 0.2, 0.0], [250, 240, 260]))
    assert got is not None and got.component is Component.GPU
    assert got.start_lag_s == pytest.approx(0.25)
    assert "device" in got.reason()


def test_without_start_times_an_issue_lag_is_host() -> None:
    got = split_lateness(*lags([300, 300], [NAN, NAN]))  # gloo records no start
    assert got is not None and got.component is Component.HOST


def test_on_time_rank_names_nothing() -> None:
    assert split_lateness(*lags([0.1, -0.2, 1.0], [0.3, NAN, 0.1])) is None
    assert split_lateness(*lags([1.0, 2.0], [NAN, NAN])) is None


def test_mixed_lateness_follows_the_larger_part() -> None:
    host = split_lateness(*lags([200, 200], [100, 100]))
    gpu = split_lateness(*lags([100, 100], [200, 200]))
    assert host is not None and host.component is Component.HOST
    assert gpu is not None and gpu.component is Component.GPU
    strict = split_lateness(
        *lags([200, 200], [100, 100]), LatenessConfig(host_share=0.7)
    )
    assert strict is not None and strict.component is Component.GPU


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="host_share"):
        LatenessConfig(host_share=1.5)
