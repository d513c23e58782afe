"""NIC port events from the node agents' heartbeats.

Flow counters show that a link stopped, not which end of it went down: both
NICs of a pipeline transfer fall silent together. The port itself knows. Each
heartbeat carries every NIC port's logical state and its ``link_downed`` /
``link_error_recovery`` counters (``Heartbeat.nics``); a counter that grew
since the previous heartbeat, or a port not ACTIVE, is a port event of that
NIC. Root cause reads them as evidence for the NIC end of a link suspect
(``rca_ports``). One event is not an anomaly (a port may retrain once
without hurting the job); a port that keeps going down is
(``detect_ports``).

Times are the heartbeat's ``ts_ns`` (host clock, like the onsets they are
compared with). The counters are 8 bits in the IB PortCounters and saturate
at 255: a saturated counter no longer grows, and only the port state is left.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from mycroft.schemas.records import NicPort

KEEP_EVENTS = 64
"""Port events kept per NIC (the newest)."""


@dataclass(frozen=True)
class PortEvents:
    """What one NIC's ports showed in a time range."""

    downs: int = 0  # link_downed + link_error_recovery increments
    seen_down: bool = False  # a heartbeat found a port not ACTIVE

    def __bool__(self) -> bool:
        """Whether anything happened."""
        return self.downs > 0 or self.seen_down


@dataclass
class _Nic:
    counters: dict[int, tuple[int, int]] = field(default_factory=dict)  # per port
    events: deque[tuple[int, int, bool]] = field(
        default_factory=lambda: deque(maxlen=KEEP_EVENTS)
    )  # (ts_ns, increments, port down)


class PortLog:
    """Port events of every NIC of a job, keyed by ``(host, nic)``."""

    def __init__(self) -> None:
        self._nics: dict[tuple[str, str], _Nic] = {}

    def observe(self, host: str, ts_ns: int, ports: Sequence[NicPort]) -> None:
        """Fold in one heartbeat's ports.

        The first reading of a port is its baseline (counters since boot are
        history, not an event); a counter that went backwards (reset) is
        taken as the new baseline; ``-1`` (unreadable) is skipped.
        """
        for p in ports:
            nic = self._nics.setdefault((host, p.nic), _Nic())
            now = (p.link_downed, p.link_recovered)
            before = nic.counters.get(p.port)
            grew = 0
            if before is not None:
                grew = sum(
                    n - b
                    for n, b in zip(now, before, strict=True)
                    if n >= 0 and b >= 0 and n > b
                )
            nic.counters[p.port] = now
            if grew or not p.up:
                nic.events.append((ts_ns, grew, not p.up))

    def newest_ns(self) -> int:
        """Time of the newest port event of any NIC (0 when none)."""
        newest = (n.events[-1][0] for n in self._nics.values() if n.events)
        return max(newest, default=0)

    def flapping(
        self, now_ns: int, window_ns: int, need: int
    ) -> list[tuple[str, str, int, int]]:
        """Return ``(host, nic, episode start ns, heartbeats with events)`` of
        each NIC with port events in ``need`` or more heartbeats of the last
        ``window_ns``. An episode is a run of events less than ``window_ns``
        apart; its start names it while it lasts."""
        out = []
        for (host, nic), found in sorted(self._nics.items()):
            times = [t for t, _, _ in found.events if t <= now_ns]
            recent = [t for t in times if t >= now_ns - window_ns]
            if len(recent) < need:
                continue
            start = times[-1]
            for t in reversed(times):
                if start - t >= window_ns:
                    break
                start = t
            out.append((host, nic, start, len(recent)))
        return out

    def events(self, host: str, nic: str, since_ns: int) -> PortEvents:
        """Port events of ``nic`` on ``host`` at or after ``since_ns``."""
        found = self._nics.get((host, nic))
        if found is None:
            return PortEvents()
        recent = [(n, down) for t, n, down in found.events if t >= since_ns]
        return PortEvents(sum(n for n, _ in recent), any(d for _, d in recent))
