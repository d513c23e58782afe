"""Record fields in words: one way to write a communicator id and a time.

Every output (``mycroft analyze``, ``mycroft incidents``, the demo, the
summaries and reasons the core writes, anomaly and incident ids) writes
them through these two functions, so a comm id or a time copied from one
output is found in every other.
"""

from __future__ import annotations

from datetime import UTC, datetime

_U64 = 0xFFFF_FFFF_FFFF_FFFF


def comm_hex(comm: int) -> str:
    """``0x0bdef175e79f5775``: ``0x`` and 16 hex digits of a communicator id."""
    return f"0x{comm & _U64:016x}"


def iso(ns: int) -> str:
    """``2026-12-03T05:50:01.250Z``: a Unix time in ns, UTC, to the millisecond."""
    seconds, rest_ns = divmod(ns, 1_000_000_000)
    moment = datetime.fromtimestamp(seconds, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{rest_ns // 1_000_000:03d}Z"


def since(ns: int, start_ns: int) -> str:
    """``+12.345 s``: ``ns`` in seconds after ``start_ns``."""
    return f"{(ns - start_ns) / 1e9:+.3f} s"


def when(ns: int, start_ns: int | None = None) -> str:
    """``2026-...Z (+12.345 s)``; the ISO time alone when ``start_ns`` is None."""
    return iso(ns) if start_ns is None else f"{iso(ns)} ({since(ns, start_ns)})"
