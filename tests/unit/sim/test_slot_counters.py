"""Slot (credit) counter semantics: staged G, posted T, completed D."""

from __future__ import annotations

import dataclasses

import numpy as np

from mycroft.producers.sim.config import Hardware
from tests.unit.sim.trace import SEND, Trace, run, small_config


def _trace(counters: str, *specs: str) -> Trace:
    cfg = dataclasses.replace(
        small_config(4.0, seed=11, interval_ms=20),
        hardware=Hardware(counters=counters),
    )
    return run(cfg, *specs)


def _gap(tr: Trace, a: str, b: str, mask: np.ndarray) -> float:
    fl = tr.flow
    gap = (fl[a] - fl[b])[mask]
    return float(gap.max()) if len(gap) else 0.0


def test_slot_counters_ordered_and_complete() -> None:
    tr = _trace("slots")
    fl = tr.flow
    assert len(fl["total"]) > 1000
    assert (fl["total"] >= fl["gpu_ready"]).all()
    assert (fl["gpu_ready"] >= fl["transmitted"]).all()
    assert (fl["transmitted"] >= fl["done"]).all()
    assert tr.result.iterations >= 2


def test_late_receiver_holds_the_senders_post() -> None:
    # Rank 9's GPU is slowed: it starts its ring steps late, so under slot
    # semantics its predecessor stages data (G) it may not post (T).
    spec = "gpu-power-cap:rank=9,at=0.5,severity=0.8"
    gaps = {}
    for mode in ("fluid", "slots"):
        tr = _trace(mode, spec)
        fl = tr.flow
        to_9 = (fl["peer"] == 9) & (fl["dir"] == SEND) & tr.of_kind(fl, "allreduce")
        gaps[mode] = _gap(tr, "gpu_ready", "transmitted", to_9)
    assert gaps["slots"] > gaps["fluid"]
    assert gaps["slots"] >= 2


def test_slow_nic_shows_a_posted_minus_completed_backlog() -> None:
    spec = "nic-bandwidth:rank=9,at=0.5,severity=0.9"
    gaps = {}
    for mode in ("fluid", "slots"):
        tr = _trace(mode, spec)
        fl = tr.flow
        out_9 = (fl["rank"] == 9) & (fl["dir"] == SEND) & tr.net(fl)
        gaps[mode] = _gap(tr, "transmitted", "done", out_9)
    assert gaps["slots"] > gaps["fluid"] + 1
