"""Hardware(allreduce="tree"): double-binary-tree all-reduce.

Job of ``trace.small_config`` with the DP gradient sync as one all-reduce:
TP groups (8 ranks of a host) and DP groups (1 -> 9 -> 17 -> 25 across
hosts) all run trees.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np

from mycroft.producers.sim.config import Hardware, Workload
from mycroft.producers.sim.tree import btree_parents, children, double_tree
from mycroft.schemas.vocab import ALGORITHMS
from tests.unit.sim.trace import (
    RECV,
    SEND,
    T0_NS,
    Trace,
    run,
    small_config,
    stuck_flows,
)

TREE = ALGORITHMS.index("tree")


@cache
def _run(tree: bool, *specs: str) -> Trace:
    cfg = dataclasses.replace(
        small_config(4.0, seed=3),
        hardware=Hardware(allreduce="tree" if tree else "ring"),
        workload=Workload(micro_batches=4, dp_allreduce=True),
    )
    return run(cfg, *specs)


def test_trees_are_nccls() -> None:
    assert btree_parents(8) == [-1, 2, 4, 2, 0, 6, 4, 6]
    t0, t1 = double_tree(8)
    assert t1 == [1, 3, 1, 7, 5, 3, 5, -1]  # mirrored: 7 is the other root
    interior = [{r for r, k in enumerate(children(t)) if k} for t in (t0, t1)]
    assert interior == [{0, 2, 4, 6}, {1, 3, 5, 7}]  # a leaf in one of them
    assert double_tree(3) == ([-1, 2, 0], [1, -1, 0])  # odd: shifted by one


def test_flows_follow_the_tree_neighbours() -> None:
    tr = _run(True)
    fl, op = tr.flow, tr.op
    assert (op["algo"][tr.of_kind(op, "allreduce")] == TREE).all()
    assert (fl["gpu_ready"] >= fl["transmitted"]).all()
    assert (fl["transmitted"] >= fl["done"]).all()
    # TP rank 2 (position 2): parent 4 and children 1, 3 on tree-0 channels
    # (0, 2), parent 1 on tree-1 channels (1, 3); a send and a recv each.
    ar = tr.of_kind(fl, "allreduce") & (fl["rank"] == 2) & (fl["bytes"] < 1 << 26)
    peers = {
        (int(c), int(p), int(d))
        for c, p, d in zip(
            fl["channel"][ar], fl["peer"][ar], fl["dir"][ar], strict=True
        )
    }
    want = {(c, p, d) for c in (0, 2) for p in (1, 3, 4) for d in (SEND, RECV)}
    want |= {(c, 1, d) for c in (1, 3) for d in (SEND, RECV)}
    assert peers == want
    topo = next(t for t in tr.topologies() if t.host == "node0000")
    tp = next(c for c in topo.ranks[2].comms if c.name == "tp")
    assert [(ch.tree_parent, ch.tree_children) for ch in tp.channels] == [
        (4, (1, 3)), (1, ()), (4, (1, 3)), (1, ())
    ]  # fmt: skip
    # A 4-rank tree is slower than the ring at 1 GiB, and both finish.
    assert tr.result.iterations >= 8 and _run(False).result.iterations >= 8


def test_reduce_node_holds_the_live_childs_data() -> None:
    # Rank 1's GPU hangs; its tree-0 parent 2 received rank 3's slices and
    # cannot reduce them: T > D on the recv flow from 3, frozen to the end.
    tr = _run(True, "gpu-hang:rank=1,at=1")
    fl = tr.flow
    last = fl["tick"] == fl["tick"].max()
    held = last & (fl["rank"] == 2) & (fl["peer"] == 3) & (fl["dir"] == RECV)
    held &= tr.of_kind(fl, "allreduce")
    assert held.sum() == 2  # channels 0 and 2
    assert (fl["transmitted"][held] == fl["total"][held]).all()
    assert (fl["done"][held] == 0).all()
    # The hung rank sends nothing; its tree-1 children 0 and 2 sent their
    # slices into the buffers its proxy posted, and they stay there.
    mine = last & (fl["rank"] == 1) & tr.of_kind(fl, "allreduce")
    sends = mine & (fl["dir"] == SEND)
    assert sends.sum() == 8 and (fl["gpu_ready"][sends] == 0).all()
    held = mine & (fl["dir"] == RECV) & (fl["transmitted"] > fl["done"])
    assert sorted(set(fl["peer"][held].tolist())) == [0, 2]
    assert (fl["channel"][held] % 2 == 1).all() and (fl["done"][held] == 0).all()
    assert (tr.done["end_ns"].max() - tr.onset_ns) / 1e9 < 0.5
    assert stuck_flows(tr, 10).sum() > 50


def _dp_allreduce_ms(tr: Trace) -> float:
    d = tr.done
    m = tr.of_kind(d, "allreduce") & (d["bytes"] > 1 << 28)
    m &= np.isin(d["rank"], [1, 9, 17, 25]) & (d["start_ns"] > T0_NS + 1.7e9)
    return float(np.median(d["end_ns"][m] - d["start_ns"][m])) / 1e6


def test_network_faults_reach_tree_jobs() -> None:
    healthy = _dp_allreduce_ms(_run(True))
    slow = _dp_allreduce_ms(_run(True, "nic-bandwidth:rank=9,at=1.5,severity=0.8"))
    assert slow > 3 * healthy
    assert _dp_allreduce_ms(_run(True, "link-flap:rank=9,at=1.5")) > 2 * healthy
    down = _run(True, "nic-down:rank=9,at=1.5")
    assert (down.done["end_ns"].max() - down.onset_ns) / 1e9 < 0.5
    assert stuck_flows(down, 10).sum() > 50


def test_mismatch_on_a_tree_allreduce() -> None:
    tr = _run(True, "collective-mismatch:rank=9,at=1.5")
    op = tr.op
    dp = tr.of_kind(op, "allreduce") & (op["bytes"] > 1 << 28)
    last = dp & (op["tick"] == op["tick"].max())
    assert set(op["bytes"][last].tolist()) == {1 << 30, 2 << 30}
    assert stuck_flows(tr, 10).sum() > 10
    # It climbs half way (128 of 256 chunks) and never descends.
    fl = tr.flow
    mine = (fl["tick"] == fl["tick"].max()) & (fl["rank"] == 17)
    mine &= tr.of_kind(fl, "allreduce") & (fl["bytes"] == 1 << 30)
    assert sorted(set(fl["done"][mine].tolist())) == [0, 128]
    assert (fl["total"][mine] == 256).all()
