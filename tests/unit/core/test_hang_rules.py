"""Hang root-cause rules that are general (not tuned to one fault).

* a rank whose liveness beat went stale while idle died (process), an
  alive-but-idle rank is a host-side stall (scored elsewhere);
* a cross-group order deadlock (a cycle of "never issued" control edges
  over two comms) blames the ranks whose issue order is the minority one;
* a NIC that died mid-ring: data ready but never sent (G>T) waits on the
  link to the receiver, so the dead NIC's rank is in the earliest blocked
  group (not only its upstream sender), and input a rank cannot consume
  because its own output cannot drain is back-pressure, not a stuck GPU.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from mycroft.schemas.vocab import RECV, SEND, Component
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.graph import OpFlows, _data_edges, terminal_groups
from mycroft.streams.core.hang_in_op import frozen_ready_not_sent, score_in_op
from mycroft.streams.core.progress import FLAT_FLOW, ProgressStore
from mycroft.streams.core.rca_config import DEFAULT_RCA
from mycroft.streams.core.rca_hang import (
    _score_lost,
    _score_order_cycle,
    _score_unresolved,
)
from mycroft.streams.core.suspect import Suspect, Suspects
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
    suspects = Suspects(DEFAULT_RCA)

    def blame(r: int) -> Suspect:
        return suspects.at(r)

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


RING = 0x30
TICK_NS, FROZE_NS = 20_000_000_000, 18_000_000_000  # frozen for 2 s


def _ring_with_dead_nic(dead: int) -> np.ndarray:
    """Ring 0->1->2->3->0, 16 chunks per flow, frozen mid-op by ``dead``'s NIC:
    both links touching it stopped with data ready on the sending side."""
    rows = []
    for r in range(4):
        nxt, prv = (r + 1) % 4, (r - 1) % 4
        cut = dead in (r, nxt)  # r's send to nxt crosses the dead NIC
        rows.append((r, nxt, SEND, 12, 4 if cut else 12, 4 if cut else 12))
        cut = dead in (prv, r)
        rows.append((r, prv, RECV, 16, 4 if cut else 12, 4 if cut else 8))
    out = np.zeros(len(rows), dtype=FLAT_FLOW)
    for i, (r, peer, d, g, t, done) in enumerate(rows):
        out[i] = (TICK_NS, r, RING, 7, 0, peer, d, 16, g, t, done, FROZE_NS, 0, 0)
    return out


def test_dead_nic_rank_is_in_the_earliest_blocked_group():
    ctx = _ctx()
    flows = _ring_with_dead_nic(2)
    g = nx.DiGraph()
    g.add_nodes_from(range(4))
    for r in range(4):
        _data_edges(g, OpFlows(flows), ctx.topo, r, RING, 7)
    assert g.edges[1, 2]["why"].startswith("data ready but not sent")
    groups = terminal_groups(g, {0, 1, 2, 3})
    assert any(2 in grp for grp in groups)


def test_unconsumed_input_behind_blocked_output_is_not_a_gpu_hang():
    ctx = _ctx()
    flows = _ring_with_dead_nic(2)
    gt = frozen_ready_not_sent(flows, 1_000_000_000)
    assert set(flows["rank"][gt].tolist()) == {1, 2}
    present = {(r, RING, 7) for r in range(4)}
    suspects = Suspects(DEFAULT_RCA)

    def blame(r: int) -> Suspect:
        return suspects.at(r)

    for r in (1, 2):
        score_in_op(blame(r), flows, {1, 2}, gt, present, blame, ctx.topo)
    # rank 1 holds input it cannot turn into output (its send to 2 is stuck):
    # no GPU verdict; rank 2's NIC carries the blame.
    assert Component.GPU not in suspects[1].scores
    top = max(suspects.values(), key=lambda s: s.best[1])
    assert top.rank == 2 and top.best[0] is Component.NIC


def test_a_frozen_send_the_receiver_posted_no_buffer_for_waits_on_the_receiver():
    """On a transport with credits a send is posted only into a buffer the
    receiver posted (its recv flow's G): data ready beyond that waits on the
    receiver (a hung GPU frees no slot), not on the sender's NIC."""
    ctx = _ctx()
    flows = _ring_with_dead_nic(2)
    gt = frozen_ready_not_sent(flows, 1_000_000_000)
    present = {(r, RING, 7) for r in range(4)}

    def score(rows: np.ndarray) -> set[str]:
        suspects = Suspects(DEFAULT_RCA)

        def blame(r: int) -> Suspect:
            return suspects.at(r)

        score_in_op(blame(2), rows, {2}, gt, present, blame, ctx.topo)
        return {str(o.rule) for o in suspects[2].observations}

    assert "frozen_ready_not_sent" in score(flows)  # buffers posted: its NIC
    starved = flows.copy()
    into3 = (starved["rank"] == 3) & (starved["dir"] == RECV)
    starved["gpu_ready"][into3] = starved["transmitted"][into3]  # no credit
    rules = score(starved)
    assert "send_to_unready" in rules and "frozen_ready_not_sent" not in rules


def _p2p_posted_not_done() -> np.ndarray:
    """Rank 0 sends to rank 1 over a dead link under credits: every chunk
    posted to the transport (T), none done; rank 1 posted its buffers (G)
    and received nothing. Rank 1 only receives in the op."""
    flows = np.zeros(2, dtype=FLAT_FLOW)
    flows["comm"], flows["seq"], flows["channel"], flows["total"] = DP, 9, 0, 8
    flows["rank"], flows["peer"], flows["dir"] = [0, 1], [1, 0], [SEND, RECV]
    flows["gpu_ready"], flows["transmitted"] = [8, 8], [8, 0]
    flows["tick_ns"] = flows["last_ns"] = 1_000_000_000
    return flows


def test_a_receiver_whose_data_never_arrived_is_not_a_kernel_that_never_ran():
    """A rank that only receives has no data of its own to move: G = T = D
    = 0 on its flows is what a dead sender or wire looks like from it."""
    ctx = _ctx()
    flows = _p2p_posted_not_done()
    gt = frozen_ready_not_sent(flows, 1_000_000_000)
    suspects = Suspects(DEFAULT_RCA)

    def blame(r: int) -> Suspect:
        return suspects.at(r)

    present = {(r, DP, 9) for r in range(2)}
    score_in_op(blame(1), flows, {0, 1}, gt, present, blame, ctx.topo)
    assert "never_moved" not in suspects[1].rules
    # The same rank with a send of its own that never moved: not started.
    mine = flows.copy()
    mine["gpu_ready"][1], mine["dir"][1] = 0, SEND
    suspects.clear()
    score_in_op(blame(1), mine, {0, 1}, gt, present, blame, ctx.topo)
    assert "never_moved" in suspects[1].rules


def _tp2_pair(*, same_host: bool) -> tuple[np.ndarray, JobTopology]:
    """Ranks 0 and 1 in a two-rank ring, nothing moved; rank 0's kernel
    offered its receive buffers (G = 2 on its recv flow), rank 1's did not."""
    topo = JobTopology()
    for r in (0, 1):
        topo.rank_host[r] = "h0" if same_host else f"h{r}"
        topo.rank_nic[r] = "nic0"
    flows = np.zeros(4, dtype=FLAT_FLOW)
    flows["comm"], flows["seq"], flows["total"] = WORLD, 3, 2
    flows["rank"], flows["peer"] = [0, 0, 1, 1], [1, 1, 0, 0]
    flows["dir"] = [SEND, RECV, SEND, RECV]
    flows["gpu_ready"] = [0, 2, 0, 0]
    return flows, topo


def test_a_same_host_pair_tells_the_dead_kernel_by_its_unoffered_buffers():
    for same_host, named in ((True, {1}), (False, {0, 1})):
        flows, topo = _tp2_pair(same_host=same_host)
        suspects = Suspects(DEFAULT_RCA)

        def blame(r: int, suspects: Suspects = suspects) -> Suspect:
            return suspects.at(r)

        _score_unresolved({0, 1}, suspects, {0, 1}, blame, flows, topo)
        assert set(suspects) == named
        rule = "no_buffer_offered" if same_host else "mutual_unstarted"
        assert all(s.rules == (rule,) for s in suspects.values())


def test_a_send_that_staged_nothing_waits_on_a_receiver_that_offered_nothing():
    """Rank 0's pipeline send to rank 1 staged nothing (G = 0) and rank 1
    offered no buffer (its recv G = 0: its part never started, e.g. behind a
    hung GPU): rank 0 waits on rank 1, which waits on rank 0's data."""
    ctx = _ctx()
    flows = np.zeros(2, dtype=FLAT_FLOW)
    flows["comm"], flows["seq"], flows["total"] = DP, 4, 16
    flows["rank"], flows["peer"], flows["dir"] = [0, 1], [1, 0], [SEND, RECV]
    g = nx.DiGraph()
    for r in (0, 1):
        _data_edges(g, OpFlows(flows), ctx.topo, r, DP, 4)
    assert g.edges[0, 1]["why"].startswith("staged nothing")
    assert terminal_groups(g, {0}) == [{0, 1}]
    # Buffers offered: the sender is where waiting ends.
    flows["gpu_ready"][1] = 8
    g = nx.DiGraph()
    for r in (0, 1):
        _data_edges(g, OpFlows(flows), ctx.topo, r, DP, 4)
    assert not g.has_edge(0, 1) and terminal_groups(g, {1}) == [{0}]


def test_op_flows_finds_each_ops_rows_in_table_order_and_the_unoffered_sends() -> None:
    fl = np.zeros(6, dtype=FLAT_FLOW)
    # rank, comm, seq, channel, dir, peer, G: two ops of rank 1 interleaved
    rows = [
        (1, 9, 3, 0, SEND, 2, 0),
        (2, 9, 3, 0, RECV, 1, 0),
        (1, 9, 4, 0, SEND, 2, 5),
        (1, 9, 3, 1, SEND, 2, 0),
        (2, 9, 3, 1, RECV, 1, 4),
        (1, 8, 3, 0, SEND, 0, 0),
    ]
    for name, col in zip(
        ("rank", "comm", "seq", "channel", "dir", "peer", "gpu_ready"),
        zip(*rows, strict=True),
        strict=True,
    ):
        fl[name] = col
    mine, unoffered = OpFlows(fl).of(1, 9, 3)
    assert mine["channel"].tolist() == [0, 1]
    # channel 0's receiver offered nothing; channel 1's offered 4 buffers
    assert unoffered.tolist() == [True, False]
    # a send whose receiver reports no row of the op says nothing
    assert OpFlows(fl).of(1, 8, 3)[1].tolist() == [False]
    assert len(OpFlows(fl).of(3, 9, 3)[0]) == 0


TREE = 0x40


def _tree_rows(rows: list[tuple[int, int, int, int, int, int]]) -> np.ndarray:
    """Flow rows of one tree op frozen for 2 s: (rank, peer, dir, G, T, D),
    16 chunks per flow, 4 receive buffers."""
    out = np.zeros(len(rows), dtype=FLAT_FLOW)
    for i, (r, peer, d, g, t, done) in enumerate(rows):
        out[i] = (TICK_NS, r, TREE, 5, 0, peer, d, 16, g, t, done, FROZE_NS, 0, 0)
    return out


def _wait_graph(flows: np.ndarray, ranks: range) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(ranks)
    for r in ranks:
        _data_edges(g, OpFlows(flows), _ctx().topo, r, TREE, 5)
    return g


def test_a_tree_node_whose_gpu_hung_is_where_the_waiting_ends():
    """Tree node 1 (parent 0, child 2) hung mid-op: every buffer it posted
    is filled with input its kernel never consumed (G = T > D), so its
    parent and child cannot send (G > T); it sent more than it received
    (its reduce goes up). It waits on nobody, and its input names its GPU."""
    flows = _tree_rows(
        [
            (0, 1, SEND, 12, 8, 8),  # broadcast down: no credit from 1
            (0, 1, RECV, 12, 12, 12),  # reduce up from 1: all consumed
            (1, 0, SEND, 12, 12, 12),
            (1, 0, RECV, 8, 8, 4),  # full of unconsumed input
            (1, 2, SEND, 4, 4, 4),
            (1, 2, RECV, 8, 8, 4),  # full of unconsumed input
            (2, 1, SEND, 12, 8, 8),  # reduce up: no credit from 1
            (2, 1, RECV, 8, 4, 4),  # waits for the broadcast
        ]
    )
    g = _wait_graph(flows, range(3))
    assert not g.out_edges(1) and g.has_edge(0, 1) and g.has_edge(2, 1)
    assert terminal_groups(g, {0, 2}) == [{1}]
    gt = frozen_ready_not_sent(flows, 1_000_000_000)
    suspects = Suspects(DEFAULT_RCA)

    def blame(r: int) -> Suspect:
        return suspects.at(r)

    present = {(r, TREE, 5) for r in range(3)}
    score_in_op(blame(1), flows, {1}, gt, present, blame, _ctx().topo)
    assert suspects[1].rules == ("unconsumed_input",)
    assert suspects[1].best[0] is Component.GPU


def test_a_tree_node_holding_one_childs_input_waits_on_the_other_child():
    """Node 1 reduces children 2 and 3; child 2's GPU hung before it sent
    anything. Node 1 holds child 3's input (G = T > D) because it waits for
    child 2's (G > T): it waits on child 2, not on child 3."""
    flows = _tree_rows(
        [
            (1, 2, RECV, 4, 0, 0),
            (1, 3, RECV, 4, 4, 0),
            (2, 1, SEND, 0, 0, 0),
            (3, 1, SEND, 8, 4, 4),
        ]
    )
    g = _wait_graph(flows, range(1, 4))
    assert g.has_edge(1, 2) and not g.has_edge(1, 3) and g.has_edge(3, 1)
    assert terminal_groups(g, {1, 3}) == [{2}]
