"""Engine snapshots that take on the restoring worker's detector config.

An engine refers to its ``DetectorConfig`` (and the config's ``RcaConfig``)
from many places: the engine, its detect context, its incident tracker. A
snapshot stores each config once, by value, as a pickle *persistent id*, so
that the worker restoring it can hand every one of those references the
config it runs with now: a worker restarted with other ``--detector`` values
applies them to the jobs it restores, as to new ones, from their next
evaluation.

Except where the config sizes state the snapshot holds: the baseline rings
(``baseline_window``), the persistence windows (``slow_of``, ``late_of``,
``recur_of``, ``hold_of``) and the transfer ring (``transfer_rows_per_rank``,
``transfer_rows_min``). A snapshot taken under other sizes keeps its own
detector thresholds (its rings stay consistent with them) and takes the
current root-cause scoring (``rca``) only; :func:`loads` says which keys
kept their old values, for the worker to log.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import fields, replace
from typing import Any

from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.rca_config import RcaConfig

SIZING = (
    "baseline_window",
    "slow_of",
    "late_of",
    "recur_of",
    "hold_of",
    "transfer_rows_per_rank",
    "transfer_rows_min",
)
"""Detector keys that size state an engine keeps (its rings and windows)."""


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:  # noqa: PLR6301 - pickle's hook
        if type(obj) in (DetectorConfig, RcaConfig):
            # By value: its own pickle (a pid's parts go through this hook).
            state = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            return (type(obj).__name__, state)
        return None


class _Unpickler(pickle.Unpickler):
    """Unpickles a snapshot, resolving its configs to ``current``'s (when
    given; else each keeps its own)."""

    def __init__(self, data: bytes, current: DetectorConfig | None) -> None:
        super().__init__(io.BytesIO(data))
        self.current = current
        self.kept: set[str] = set()
        self.seen: dict[bytes, Any] = {}  # one object per config, as dumped

    def persistent_load(self, pid: Any) -> Any:
        kind, state = pid
        if kind not in ("DetectorConfig", "RcaConfig"):
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        if state not in self.seen:
            self.seen[state] = self._resolve(pickle.loads(state))  # noqa: S301
        return self.seen[state]

    def _resolve(self, old: Any) -> Any:
        now = self.current
        if now is None:
            return old
        if isinstance(old, RcaConfig):
            return now.rca
        if all(getattr(old, k) == getattr(now, k) for k in SIZING):
            return now
        self.kept |= {
            f.name
            for f in fields(DetectorConfig)
            if f.name != "rca" and getattr(old, f.name) != getattr(now, f.name)
        }
        return replace(old, rca=now.rca)


def dumps(obj: Any) -> bytes:
    """Pickle ``obj``, its detector and scoring configs by persistent id."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


def loads(data: bytes, current: DetectorConfig | None) -> tuple[Any, set[str]]:
    """Unpickle what :func:`dumps` wrote with ``current`` as its configs (None:
    the snapshot's own); also return the detector keys that kept the
    snapshot's values (a sizing key differs; empty when ``current`` was
    taken on whole)."""
    reader = _Unpickler(data, current)
    return reader.load(), reader.kept
