"""Wait-for graph: who each blocked rank is waiting on, and why.

Nodes are global ranks. An edge ``u -> v`` says "u cannot progress until v
does", with ``kind`` = ``control`` (v never issued the op u is in; per-rank op
order across communicators carries this across groups) or ``data`` (u's data
comes from v: ring prev, tree parent/child, PP send/recv, a recv flow, a
send flow v never acknowledged, data ready for v that the link never
took, or a send to v that staged nothing while v offered no buffer). Lost
ranks have no out-edges: their last state is stale, and they are where
waiting ends.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from mycroft.schemas.vocab import RECV, SEND
from mycroft.streams.core.progress import ProgressStore
from mycroft.streams.core.topology import JobTopology


def _members(store: ProgressStore, topo: JobTopology, comm: int) -> list[int]:
    ranks = topo.members(comm)
    if ranks:
        return list(ranks)
    s = store.slots
    return sorted(set(s["rank"][s["comm"] == comm].tolist()))


def build_wait_graph(
    store: ProgressStore, topo: JobTopology, lost: set[int]
) -> nx.DiGraph:
    """Build the wait-for graph of the latest state.

    Args:
        store: Progress state (slots, latest in-flight ops and flows).
        topo: Job topology, for members and ring/tree neighbours.
        lost: Ranks known to be gone; they get no out-edges.

    Returns:
        A ``networkx.DiGraph`` over ranks; edge attributes ``kind``, ``comm``,
        ``seq``, ``channel`` and ``why``.
    """
    g: nx.DiGraph = nx.DiGraph()
    s = store.slots
    issued = {
        (int(c), int(r)): int(i)
        for c, r, i in zip(
            s["comm"].tolist(), s["rank"].tolist(), s["issued"].tolist(), strict=True
        )
    }
    flows = store.latest_flows()
    ops = OpFlows(flows)
    busy = s[s["issued"] > s["done"]]
    g.add_nodes_from(int(r) for r in s["rank"].tolist())
    for row in busy:
        rank, comm, seq = int(row["rank"]), int(row["comm"]), int(row["done"]) + 1
        if rank in lost:
            continue
        late = [
            m
            for m in _members(store, topo, comm)
            if m != rank and issued.get((comm, m), -1) < seq
        ]
        for m in late:
            g.add_edge(
                rank,
                m,
                kind="control",
                comm=comm,
                seq=seq,
                channel=None,
                why=f"rank {m} never issued seq {seq}",
            )
        if not late:
            _data_edges(g, ops, topo, rank, comm, seq)
    return g


class OpFlows:
    """The latest flow rows, looked up by op: the rows of ``(rank, comm,
    seq)`` and, per row, whether it is an unoffered send
    (:func:`_unoffered_sends`). Indexed once, on the first lookup, rather
    than filtered per busy rank (a 4,096-rank hang has thousands)."""

    def __init__(self, flows: np.ndarray) -> None:
        """Wrap ``flows`` (``ProgressStore.latest_flows()``)."""
        self.flows = flows
        self._unoffered: np.ndarray | None = None
        self._rows: dict[tuple[int, int, int], np.ndarray] | None = None

    def of(self, rank: int, comm: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s flow rows in op ``(comm, seq)``, in table order, and
        their unoffered-send mask."""
        if self._rows is None or self._unoffered is None:
            self._rows = _rows_by_op(self.flows)
            self._unoffered = _unoffered_sends(self.flows)
        rows = self._rows.get((rank, comm, seq), np.zeros(0, dtype=np.int64))
        return self.flows[rows], self._unoffered[rows]


def _rows_by_op(flows: np.ndarray) -> dict[tuple[int, int, int], np.ndarray]:
    """Row indices of ``flows`` per ``(rank, comm, seq)``, each in table order."""
    if not len(flows):
        return {}
    rank, comm, seq = flows["rank"], flows["comm"], flows["seq"]
    order = np.lexsort((seq, comm, rank))  # stable: table order within an op
    r, c, q = rank[order], comm[order], seq[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1]) | (q[1:] != q[:-1])
    starts = np.flatnonzero(new)
    keys = zip(r[starts].tolist(), c[starts].tolist(), q[starts].tolist(), strict=True)
    return dict(zip(keys, np.split(order, starts[1:]), strict=True))


def buffers_full(flows: np.ndarray) -> np.ndarray:
    """Mask of receive rows whose every posted buffer (G) holds data that
    arrived (T) and that the receiving kernel has not consumed (D): G = T >
    D. Their sender can put nothing more until the receiver's GPU moves."""
    out: np.ndarray = (
        (flows["dir"] == RECV)
        & (flows["gpu_ready"] == flows["transmitted"])
        & (flows["transmitted"] > flows["done"])
    )
    return out


def _data_edges(  # noqa: PLR0917 - private helper of one module
    g: nx.DiGraph, ops: OpFlows, topo: JobTopology, rank: int, comm: int, seq: int
) -> None:
    mine, unoffered = ops.of(rank, comm, seq)
    # A recv flow waits on its peer only while data is still to arrive
    # (``transmitted`` = arrived < total) and the receiver is not the one
    # holding it back: data that arrived but was not consumed (``done``)
    # waits on the receiving rank's own GPU, and when every buffer it posted
    # (``gpu_ready``) is filled with such data the sender has nowhere to put
    # more (schemas/ring.md, recv flows): the receiver waits on itself.
    waiting = (
        (
            (mine["dir"] == RECV)
            & (mine["transmitted"] < mine["total"])
            & ~buffers_full(mine),
            "waits for data from peer",
        ),
        (
            (mine["dir"] == SEND) & (mine["transmitted"] > mine["done"]),
            "sent data the peer never acknowledged",
        ),
        # Data ready but not sent (G > T) waits on the link and on the
        # receiver's credit: the path to the peer, whichever end of it failed.
        (
            (mine["dir"] == SEND)
            & (mine["gpu_ready"] > mine["transmitted"])
            & (mine["transmitted"] == mine["done"]),
            "data ready but not sent: waits on the link to the peer",
        ),
    )
    # A send that staged nothing to a receiver that offered no buffer for
    # it waits on the receiver (its part of the op never started).
    for mask, why in (
        *waiting,
        (unoffered, "staged nothing: the receiver offered no buffer"),
    ):
        for f in mine[mask]:
            g.add_edge(
                rank,
                int(f["peer"]),
                kind="data",
                comm=comm,
                seq=seq,
                channel=int(f["channel"]),
                why=why,
            )
    if len(mine) == 0:  # no flow rows: fall back on the topology's upstream peers
        info = topo.comms.get(comm)
        for peer, ch in sorted(info.upstream(rank)) if info else []:
            g.add_edge(
                rank,
                peer,
                kind="data",
                comm=comm,
                seq=seq,
                channel=ch,
                why="topological upstream (no flow rows)",
            )


def _unoffered_sends(flows: np.ndarray) -> np.ndarray:
    """Per row of ``flows``: a send flow with nothing staged (G = 0) whose
    receiver's flow of the same op and channel reports no buffer posted (its
    G = 0); a receiver with no such row says nothing."""
    out = np.zeros(len(flows), dtype=bool)
    send = flows["dir"] == SEND
    recv = flows["dir"] == RECV
    idle = send & (flows["gpu_ready"] == 0)
    if not idle.any() or not recv.any():
        return out
    # One key per sender-receiver pair of an op's channel, from either end.
    key = np.empty(
        len(flows),
        dtype=[
            ("src", "<i4"),
            ("dst", "<i4"),
            ("comm", "<u8"),
            ("seq", "<i8"),
            ("ch", "<i2"),
        ],
    )
    key["src"] = np.where(send, flows["rank"], flows["peer"])
    key["dst"] = np.where(send, flows["peer"], flows["rank"])
    key["comm"], key["seq"], key["ch"] = flows["comm"], flows["seq"], flows["channel"]
    _, pair = np.unique(key, return_inverse=True)
    reported = np.bincount(pair[recv], minlength=pair.max() + 1) > 0
    offered = (
        np.bincount(pair[recv & (flows["gpu_ready"] > 0)], minlength=pair.max() + 1) > 0
    )
    at = pair[idle]
    out[idle] = reported[at] & ~offered[at]
    return out


def terminal_groups(g: nx.DiGraph, start: set[int]) -> list[set[int]]:
    """Return the sink strongly-connected groups reachable from ``start``.

    Each group is an "earliest blocked point": nobody in it waits on anyone
    outside it. A single lost or idle rank is a group of one; a ring whose
    every member waits on its predecessor is one group.
    """
    reach: set[int] = set()
    for node in start:
        if node in g:
            reach |= nx.descendants(g, node) | {node}
    if not reach:
        return []
    sub = g.subgraph(reach)
    cond = nx.condensation(sub)
    sinks = [n for n in cond.nodes if cond.out_degree(n) == 0]
    return [set(cond.nodes[n]["members"]) for n in sinks]
