"""Host or device for a late rank of Flight Recorder dumps.

Per op recorded by several ranks: the rank's issue lag (``time_created_ns``
against its peers' median) and start lag (``time_discovered_started_ns -
time_created_ns`` against its peers' median; unknown where the backend
records no start, as gloo). ``lateness.split_lateness`` names the part.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mycroft.producers.torch.frdump import FrDumps, FrEntry
from mycroft.streams.core.lateness import Lateness, LatenessConfig, split_lateness
from mycroft.streams.fr_checks import ops_by_unit


def _delay(e: FrEntry) -> float:
    return float(e.started_ns - e.created_ns) if e.started_ns else float("nan")


def _lags(rows: list[FrEntry], rank: int) -> tuple[float, float] | None:
    """``(issue lag, start lag)`` of ``rank`` in one op, ns; None if absent."""
    mine = [e for e in rows if e.rank == rank]
    peers = [e for e in rows if e.rank != rank]
    if not mine or not peers:
        return None
    issue = mine[0].created_ns - float(np.median([e.created_ns for e in peers]))
    delays = [_delay(e) for e in peers]
    known = [x for x in delays if not np.isnan(x)]
    start = _delay(mine[0]) - float(np.median(known)) if known else float("nan")
    return issue, start


def rank_lateness(
    d: FrDumps, rank: int, config: LatenessConfig | None = None
) -> Lateness | None:
    """Where ``rank``'s lateness over every shared op of the dumps comes from."""
    got = [_lags(rows, rank) for rows in ops_by_unit(d).values()]
    lags = np.array([g for g in got if g is not None], dtype=np.float64)
    if not len(lags):
        return None
    return split_lateness(lags[:, 0], lags[:, 1], config)


def relabel_slow(d: FrDumps, rows: list[dict[str, Any]]) -> None:
    """Set host or gpu on each slowdown row whose rank is late, and say why."""
    for row in rows:
        if row["kind"] != "slowdown" or row["component"] not in ("gpu", "host"):
            continue
        got = rank_lateness(d, row["rank"])
        if got is None:
            continue
        row["component"] = got.component.value
        row["reason"] = f"rank {row['rank']} {got.reason()} (core: {row['reason']})"
