"""Record times plausible against each host's own history and the job's.

Used twice: by the job's :class:`~mycroft.streams.core.record_gate.RecordGate`
before state, and by the worker at intake, before a record's time can move
the job's event clock (``event_time.py``): a tick of int64 max or of a host
whose clock jumped years must never become the job's event time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mycroft.streams.core.contract import Contract, Reason
from mycroft.streams.core.scoring import MAJORITY, PEERS

Problem = tuple[Reason, str]
_REFRESH = 64
"""Accepted times between two recomputations of the job's reference time."""


@dataclass
class HostClocks:
    """Newest accepted time per host, and the job's reference (their median)."""

    contract: Contract = field(default_factory=Contract)
    newest: dict[str, int] = field(default_factory=dict)
    _ref: tuple[int, int] = (0, 0)  # (median of the hosts' newest, hosts in it)
    _since: int = _REFRESH

    def problem(
        self, job_id: str, host: str, t: int, replay: bool = False
    ) -> Problem | None:
        """The rule a record of ``host`` at time ``t`` breaks, or ``None``.

        ``replay``: rows held earlier, checked again (their age is known).
        """
        c = self.contract
        if max(len(job_id), len(host)) > c.max_name_len:
            return Reason.TOO_LARGE, f"job id or host over {c.max_name_len} characters"
        if not c.min_time_ns <= t <= c.max_time_ns:
            return Reason.TIME_RANGE, f"time {t} ns is outside years 2000-2100"
        newest = self.newest.get(host, 0)
        if newest and t > newest + c.max_jump_ns:
            return (
                Reason.TIME_JUMP,
                f"{(t - newest) / 1e9:.0f} s after the host's newest",
            )
        if newest and not replay and t < newest - c.max_behind_ns:
            return (
                Reason.TIME_JUMP,
                f"{(newest - t) / 1e9:.0f} s before the host's newest",
            )
        ref, hosts = self._reference()
        if hosts >= PEERS and host not in self.newest or hosts >= MAJORITY:
            if t > ref + c.max_skew_ns:
                return (
                    Reason.CLOCK_SKEW,
                    f"{(t - ref) / 1e9:.0f} s ahead of the job's hosts",
                )
        return None

    def accept(self, host: str, t: int) -> None:
        """Take ``t`` as a valid time of ``host``."""
        if t > self.newest.get(host, 0):
            if host not in self.newest:
                self._since = _REFRESH
            self.newest[host] = t
            self._since += 1

    def _reference(self) -> tuple[int, int]:
        if self._since >= _REFRESH:
            times = list(self.newest.values())
            self._ref = (int(np.median(times)) if times else 0, len(times))
            self._since = 0
        return self._ref
