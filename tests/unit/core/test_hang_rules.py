"""Hang root-cause rules that are general (not tuned to one fault).

* a rank whose liveness beat went stale while idle died (process), an
  alive-but-idle rank is a host-side stall (scored elsewhere);
* a cross-group order deadlock (a cycle of "never issued" control edges
  over two comms) blames the ranks whose issue order is the minority one.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from mycroft.schemas.vocab import Component
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.progress import FLAT_FLOW, ProgressStore
from mycroft.streams.core.rca_hang import Suspect, _score_lost, _score_order_cycle
from mycroft.streams.core.topology import JobTopology

WORLD, DP = 0x10, 0x20


def _ctx() -> DetectContext:
    cfg = DetectorConfig()
    topo = JobTopology()
    for r in range(4):
        topo.rank_host[r] = f"h{r}"
        topo.rank_nic[r] = "nic0"
    return DetectContext(
        "j", ProgressStore(cfg.history_ns), topo, BaselineBook(64), cfg
    )


def test_idle_rank_with_stale_beat_is_a_dead_process():
    ctx = _ctx()
    sus = Suspect(3)
    _score_lost(ctx, sus, "seen", np.zeros(0, dtype=FLAT_FLOW), {3})
    assert sus.best[0] is Component.PROCESS
    # A whole host gone silent stays a host (or its NIC).
    sus = Suspect(3)
    _score_lost(ctx, sus, "host", np.zeros(0, dtype=FLAT_FLOW), {3})
    assert sus.best[0] is Component.HOST


def _cycle(minority: list[int]) -> nx.DiGraph:
    g = nx.DiGraph()
    majority = [r for r in range(4) if r not in minority]
    for u in majority:
        for v in minority:
            g.add_edge(u, v, kind="control", comm=WORLD, seq=20, why="")
    for u in minority:
        for v in majority:
            g.add_edge(u, v, kind="control", comm=DP, seq=20, why="")
    return g


def test_order_deadlock_blames_the_minority_issue_order():
    ctx = _ctx()
    suspects: dict[int, Suspect] = {}

    def blame(r: int) -> Suspect:
        return suspects.setdefault(r, Suspect(r))

    _score_order_cycle(ctx, _cycle([3]), {0, 1, 2, 3}, set(), blame)
    assert list(suspects) == [3]
    assert suspects[3].best[0] is Component.HOST
    # No majority order (2 vs 2): nobody is named by this rule.
    suspects.clear()
    _score_order_cycle(ctx, _cycle([2, 3]), {0, 1, 2, 3}, set(), blame)
    assert not suspects
    # A data edge in the group: not a pure order cycle.
    g = _cycle([3])
    g.add_edge(3, 0, kind="data", comm=DP, seq=20, why="")
    _score_order_cycle(ctx, g, {0, 1, 2, 3}, set(), blame)
    assert not suspects
