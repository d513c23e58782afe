"""Host or device: where a late rank's lateness comes from.

A rank arrives late at a collective when its op starts after its peers'.
That time splits in two: how late its CPU *issued* the op (issue lag, against
the peers' median issue time) and how much longer than its peers' the op
then waited to *start* (start lag: queue time on the device). A rank whose
ops are issued late and start as soon as issued is slow on the host (data
loading, Python, a busy CPU); one that issues on time and starts late is
slow on the device (the previous kernels on its stream). Pure numpy; the
caller computes the lags from its records.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mycroft.schemas.vocab import Component


@dataclass(frozen=True)
class LatenessConfig:
    """Thresholds of the split.

    Attributes:
        floor_s: An op counts as late when issue lag plus start lag reaches
            this (the core's ``late_floor_s``: clock offsets stay below it).
        host_share: The host is named when the issue lag is at least this
            share of the lateness: the larger part of the time is then spent
            before the op exists on the device.
    """

    floor_s: float = 0.005
    host_share: float = 0.5

    def __post_init__(self) -> None:
        if self.floor_s <= 0 or not 0 < self.host_share < 1:
            raise ValueError(
                "LatenessConfig: floor_s must be > 0 and host_share in (0, 1); "
                f"got {self.floor_s}, {self.host_share}"
            )


@dataclass(frozen=True)
class Lateness:
    """A late rank's verdict: its component and the median lags, seconds."""

    component: Component
    issue_lag_s: float
    start_lag_s: float
    late_ops: int

    def reason(self) -> str:
        """One sentence for a root cause's reason."""
        if self.component is Component.HOST:
            return (
                f"issued its ops {self.issue_lag_s * 1e3:.1f} ms after its peers "
                f"(median of {self.late_ops} late ops) and they started as soon "
                "as issued: the host side (CPU) is late"
            )
        return (
            f"issued its ops on time but they started {self.start_lag_s * 1e3:.1f} "
            f"ms after its peers' (median of {self.late_ops} late ops): the device "
            "is late"
        )


def split_lateness(
    issue_lag_ns: npt.NDArray[np.float64],
    start_lag_ns: npt.NDArray[np.float64],
    config: LatenessConfig | None = None,
) -> Lateness | None:
    """Name host or gpu for one rank from its per-op lags.

    Args:
        issue_lag_ns: Per op, the rank's issue time minus its peers' median.
        start_lag_ns: Per op, the rank's issue-to-start time minus its peers'
            median; NaN where the recorder has no start time (gloo).

    Returns:
        None when no op is late, or when the issue lag does not explain the
        lateness and no start time says the device does.
    """
    cfg = config or LatenessConfig()
    start = np.nan_to_num(start_lag_ns, nan=0.0)
    late = (issue_lag_ns + np.maximum(start, 0.0)) >= cfg.floor_s * 1e9
    if not late.any():
        return None
    issue_s = float(np.median(issue_lag_ns[late])) / 1e9
    known = late & ~np.isnan(start_lag_ns)
    start_s = float(np.median(start_lag_ns[known])) / 1e9 if known.any() else 0.0
    n = int(late.sum())
    explains = issue_s >= cfg.host_share * (issue_s + max(start_s, 0.0))
    if issue_s >= cfg.floor_s and explains:
        return Lateness(Component.HOST, issue_s, start_s, n)
    if known.any() and start_s >= cfg.floor_s:
        return Lateness(Component.GPU, issue_s, start_s, n)
    return None
