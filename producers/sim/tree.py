"""Double-binary-tree all-reduce (``Hardware(allreduce="tree")``).

The trees over comm ranks ``0..n-1`` are NCCL's (``ncclGetBtree`` and
``ncclGetDtree``): tree 0 is the in-order binary tree rooted at 0, tree 1 its
mirror (``n`` even) or tree 0 shifted by one (``n`` odd), so most ranks are
interior in one tree and a leaf in the other. Channel ``c`` runs tree
``c % 2`` over its share of the bytes (every channel carries ``bytes /
channels``).

A channel's data is cut into slices of ``cps`` chunks. Slice ``k`` climbs: a
node reduces its own data with slice ``k`` of each child and sends the sum
to its parent; the root's reduction ends the climb and slice ``k`` descends,
each node forwarding it to its children. Per edge and slice the sender's
intervals follow the ring's fluid model (``collective.py``)::

    G  gb = max(avail, ge[k-1]);          ge = gb + copy
    T  tb = max(gb, te[k-1], credit) + proxy;  te = max(ge + proxy, tb + wire)
    D  db = max(tb + lat, de[k-1]);       de = max(te + lat, db)

``credit`` is when the receiver consumed slice ``k - L`` (``L`` slices fill
``buffer_chunks`` slots; for ``k < L`` when its proxy posted the buffers, at
the op's enqueue), so a sender runs at most ``L`` slices ahead of its
receiver; and the sender's GPU stages slice ``k`` only into a slot freed by
the completion of its slice ``k - L``. A receive flow reports G = the credit
(the buffer posted), T = the sender's D (arrived), D = the receiver's use
of the slice: its reduction (its own send's G, the root's sum) going up, its
forward to its children (a leaf's copy out) going down. A node waiting on a
dead child never reduces, so the other child's receive flow holds ``L``
slices it received and did not consume (T > D), as NCCL's tree does; a hung
GPU holds what its own children and parent sent into its posted buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mycroft.producers.sim.collective import SIMPLE, OpRequest, Physics
from mycroft.producers.sim.opblock import OpBlock
from mycroft.schemas.vocab import ALGORITHMS, OP_NAMES, RECV, SEND

TREE = ALGORITHMS.index("tree")
Profile = tuple[int, int, np.ndarray, bool, np.ndarray]
"""One flow shape of a node: peer comm rank, direction, intervals ``(G, 3, 2,
S)``, and whether it belongs to the descent."""
MAX_SLICES = 64
"""Slices per channel at most (bounds the simulation cost of a 1 GiB op)."""


def btree_parents(n: int) -> list[int]:
    """Parent of every rank in NCCL's binary tree over ``n`` ranks (-1: root)."""
    out = [-1] * n
    for rank in range(1, n):
        bit = 1
        while bit < n and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        out[rank] = up if up < n else rank ^ bit
    return out


def double_tree(n: int) -> tuple[list[int], list[int]]:
    """Parents in NCCL's two trees: tree 0, and its mirror (even ``n``) or
    its shift by one (odd ``n``)."""
    t0 = btree_parents(n)
    if n % 2:

        def back(x: int) -> int:
            return (x + 1) % n

        t1 = [-1] * n
        for rank in range(n):
            p = t0[(rank - 1) % n]
            t1[rank] = -1 if p < 0 else back(p)
        return t0, t1
    t1 = [-1 if t0[n - 1 - r] < 0 else n - 1 - t0[n - 1 - r] for r in range(n)]
    return t0, t1


def children(parents: list[int]) -> list[list[int]]:
    """Children of every rank of a tree given as parents."""
    out: list[list[int]] = [[] for _ in parents]
    for r, p in enumerate(parents):
        if p >= 0:
            out[p].append(r)
    return out


def tree_count(channels: int, n: int) -> int:
    """Trees in use: two when there are two channels and two ranks."""
    return 2 if channels > 1 and n > 1 else 1


@dataclass
class _Edge:
    """One tree edge's per-slice sender intervals ``(G, 3, 2, S)`` and when
    the receiver posted each slice's buffer ``(G, S)``."""

    src: int
    dst: int
    link: tuple[np.ndarray, ...]
    out: np.ndarray
    ge: np.ndarray
    te: np.ndarray
    de: np.ndarray
    posted: np.ndarray


@dataclass
class _Pass:
    """One tree's edges and, per node and slice, when it used a slice
    ``(n, G, 2, S)`` going up (its reduction) and down (its forward)."""

    parents: list[int]
    kids: list[list[int]]
    order: list[int]
    up: dict[int, _Edge]
    down: dict[tuple[int, int], _Edge]
    use_up: np.ndarray
    use_down: np.ndarray


class TreeAllreduce:
    """Time one tree all-reduce of every group of a role."""

    def __init__(self, phys: Physics, req: OpRequest) -> None:
        self.phys, self.req = phys, req
        self.ranks = req.ranks
        g, self.n = req.ranks.shape
        hw = phys.hw
        flow_chunks = max(1, -(-req.nbytes // req.channels // hw.chunk_bytes))
        self.cps = min(flow_chunks, max(1, hw.buffer_chunks // 2))
        self.steps = -(-flow_chunks // self.cps)
        if self.steps > MAX_SLICES:
            self.steps = MAX_SLICES
            self.cps = -(-flow_chunks // MAX_SLICES)
        self.credit = max(1, hw.buffer_chunks // self.cps)
        self.start = phys._launch(req.ranks, req.issue, req.gpu_free)
        # A receiver's proxy posts its buffers when the op is enqueued, not
        # when its kernel starts: the first slots exist while its GPU is busy.
        self.posted = req.issue + hw.proxy_latency_s
        self.slice_bytes = np.full(g, req.nbytes // self.steps, dtype=np.int64)
        self.trees = tree_count(req.channels, self.n)

    def edge(self, src: int, dst: int) -> _Edge:
        """A fresh edge from comm rank ``src`` to ``dst``."""
        r = self.ranks
        link = self.phys._link(
            r[:, src], r[:, dst], self.req.issue[:, src], self.slice_bytes, 1
        )
        g = len(r)
        none = np.full(g, -np.inf)
        out = np.empty((g, 3, 2, self.steps))
        posted = np.empty((g, self.steps))
        return _Edge(src, dst, link, out, self.start[:, src], none, none.copy(), posted)

    def send(
        self,
        e: _Edge,
        k: int,
        avail: np.ndarray,
        credit: np.ndarray,
        share: int = 1,
    ) -> None:
        """Slice ``k`` over edge ``e`` once ``avail`` (data) and ``credit``
        (receiver's slot); ``share`` sends leave the rank side by side."""
        hw, fx, r = self.phys.hw, self.phys.fx, self.ranks
        src, dst = r[:, e.src], r[:, e.dst]
        copy_s, wire_s, _, lat, net, _ = e.link
        jit = self.phys._jitter((2, len(src)))
        gb = np.maximum(avail, e.ge)
        if k >= self.credit:  # the GPU stages into a slot its proxy freed
            gb = np.maximum(gb, e.out[:, 2, 1, k - self.credit])
        ge = gb + copy_s * jit[0]
        ge = np.where(ge > fx.gpu_dead[src], np.inf, ge)
        tb = np.maximum(np.maximum(gb, credit), e.te) + hw.proxy_latency_s
        te = np.maximum(ge + hw.proxy_latency_s, tb + share * wire_s * jit[1])
        tb, te, _, _ = fx.pause(tb, te, src, dst, net)
        te = np.where(te > fx.proc_dead[src], np.inf, te)
        db = np.maximum(tb + lat, e.de)
        de = np.maximum(te + lat, db)
        de = np.where(de > fx.proc_dead[dst], np.inf, de)
        e.out[..., k] = np.stack(
            [np.stack(p, -1) for p in ((gb, ge), (tb, te), (db, de))], -2
        )
        e.ge, e.te, e.de = ge, te, de
        e.posted[:, k] = credit

    def consume(self, node: int, avail: np.ndarray) -> tuple[np.ndarray, ...]:
        """``[b, e]`` of node ``node`` using a slice available at ``avail``."""
        copy_s = self.phys._link(
            self.ranks[:, node],
            self.ranks[:, node],
            self.req.issue[:, node],
            self.slice_bytes,
            1,
        )[0]
        end = avail + copy_s * self.phys._jitter(avail.shape)
        dead = self.phys.fx.gpu_dead[self.ranks[:, node]]
        return avail, np.where(end > dead, np.inf, end)

    def run_tree(self, parents: list[int]) -> dict[int, list[Profile]]:
        """Per node: ``(peer comm rank, direction, intervals (G, 3, 2, S))``."""
        kids = children(parents)
        order = _preorder(parents, kids)
        g, s = len(self.ranks), self.steps
        st = _Pass(
            parents,
            kids,
            order,
            {i: self.edge(i, parents[i]) for i in order if parents[i] >= 0},
            {(i, c): self.edge(i, c) for i in order for c in kids[i]},
            np.empty((self.n, g, 2, s)),
            np.empty((self.n, g, 2, s)),
        )
        for k in range(s):
            self._climb(k, st)
            self._descend(k, st)
        return self._profiles(st)

    def _slot(self, use: np.ndarray, node: int, k: int) -> np.ndarray:
        if k < self.credit:
            slot: np.ndarray = self.posted[:, node]
            return slot
        freed: np.ndarray = use[node, :, 1, k - self.credit]
        return freed

    def _climb(self, k: int, st: _Pass) -> None:
        for i in reversed(st.order):
            avail = self.start[:, i]
            for c in st.kids[i]:
                avail = np.maximum(avail, st.up[c].out[:, 2, 1, k])
            if st.parents[i] < 0:
                if k:  # the root sums one slice after the other
                    avail = np.maximum(avail, st.use_up[i, :, 1, k - 1])
                b, e = self.consume(i, avail)
            else:
                edge = st.up[i]
                self.send(edge, k, avail, self._slot(st.use_up, st.parents[i], k))
                b, e = edge.out[:, 0, 0, k], edge.out[:, 0, 1, k]
            st.use_up[i, :, 0, k], st.use_up[i, :, 1, k] = b, e

    def _descend(self, k: int, st: _Pass) -> None:
        for i in st.order:
            p, kids = st.parents[i], st.kids[i]
            avail = st.use_up[i, :, 1, k] if p < 0 else st.down[(p, i)].out[:, 2, 1, k]
            for c in kids:
                credit = self._slot(st.use_down, c, k)
                self.send(st.down[(i, c)], k, avail, credit, len(kids))
            if kids:
                first = st.down[(i, kids[0])].out
                b, e = first[:, 0, 0, k], first[:, 0, 1, k]
            else:
                if k:  # a leaf copies one slice out after the other
                    avail = np.maximum(avail, st.use_down[i, :, 1, k - 1])
                b, e = self.consume(i, avail)
            st.use_down[i, :, 0, k], st.use_down[i, :, 1, k] = b, e

    def _profiles(self, st: _Pass) -> dict[int, list[Profile]]:
        out: dict[int, list[Profile]] = {}
        for i in range(self.n):
            rows: list[Profile] = []
            p = st.parents[i]
            if p >= 0:
                # One send and one recv flow per neighbour: the climb goes
                # to the parent, the descent comes back from it.
                up = st.up[i].out
                rows.append((p, SEND, up, False, up[:, 0]))
                edge = st.down[(p, i)]
                down = _recv(edge, st.use_down[i])
                rows.append((p, RECV, down, True, _posts(edge)))
            for c in st.kids[i]:
                edge = st.up[c]
                rows.append((c, RECV, _recv(edge, st.use_up[i]), False, _posts(edge)))
                dn = st.down[(i, c)].out
                rows.append((c, SEND, dn, True, dn[:, 0]))
            out[i] = rows
        return out


def _recv(edge: _Edge, use: np.ndarray) -> np.ndarray:
    """Receive-side intervals of the flow over ``edge``: G at the sender's
    transmit (its first progress; the buffers posted are reported apart), T
    when the sender's transfer completed, D at ``use``."""
    send = edge.out
    out = np.empty_like(send)
    out[:, 0], out[:, 1] = send[:, 1], send[:, 2]
    out[:, 2] = np.maximum(use, send[:, 2])
    return out


def _posts(edge: _Edge) -> np.ndarray:
    """``[b, e]`` ``(G, 2, S)`` of each slice's buffer posted over ``edge``."""
    return np.repeat(edge.posted[:, None, :], 2, 1)


def _preorder(parents: list[int], kids: list[list[int]]) -> list[int]:
    order: list[int] = []
    todo = [r for r, p in enumerate(parents) if p < 0]
    while todo:
        r = todo.pop(0)
        order.append(r)
        todo.extend(kids[r])
    return order


def tree_allreduce(
    phys: Physics, req: OpRequest, culprit: np.ndarray | None = None
) -> list[OpBlock]:
    """One tree all-reduce of every group, as blocks of rows that share a
    flow layout (leaves, interior ranks and roots differ in flows)."""
    op = TreeAllreduce(phys, req)
    trees = [op.run_tree(p) for p in double_tree(op.n)[: op.trees]]
    nbytes = np.full(req.ranks.shape, req.nbytes, dtype=np.int64)
    times_of: list[np.ndarray] = []
    posts_of: list[np.ndarray] = []
    if culprit is not None and culprit.any():
        nbytes = np.where(culprit, nbytes * 2, nbytes)
    layouts: dict[tuple[int, ...], list[int]] = {}
    flows_of: list[list[tuple[int, int, int, int]]] = []
    for i in range(op.n):
        profiles = [x for t in trees for x in t[i]]
        offset = np.cumsum([0] + [len(t[i]) for t in trees])
        flows = [
            (c, peer, d, int(offset[c % op.trees]) + j)
            for c in range(req.channels)
            for j, (peer, d, _, _, _) in enumerate(trees[c % op.trees][i])
        ]
        times = np.stack([x[2] for x in profiles], axis=1)  # (G, K, 3, 2, S)
        posts_of.append(np.stack([x[4] for x in profiles], axis=1))
        if culprit is not None and culprit.any():
            # A mismatched op climbs half way and never descends.
            hit = culprit.any(axis=1)
            descent = np.array([x[3] for x in profiles])
            times[np.ix_(hit, descent)] = np.inf
            times[np.ix_(hit, ~descent)] = np.where(
                np.arange(op.steps) >= (op.steps + 1) // 2,
                np.inf,
                times[np.ix_(hit, ~descent)],
            )
        times_of.append(times)
        flows_of.append(flows)
        key = (len(profiles), len(flows))
        layouts.setdefault(key, []).append(i)
    rows = _Rows(times_of, flows_of, nbytes, posts_of)
    return [_block(op, nodes, rows) for nodes in layouts.values()]


@dataclass(frozen=True)
class _Rows:
    """Per comm rank: intervals ``(G, K, 3, 2, S)`` and flows ``(channel,
    peer, dir, profile)``; bytes ``(G, n)``."""

    times: list[np.ndarray]
    flows: list[list[tuple[int, int, int, int]]]
    nbytes: np.ndarray
    posts: list[np.ndarray]


def _block(op: TreeAllreduce, nodes: list[int], r: _Rows) -> OpBlock:
    phys, req = op.phys, op.req
    times_of, flows_of, nbytes = r.times, r.flows, r.nbytes
    g = len(req.ranks)
    flows = np.array([flows_of[i] for i in nodes])  # (P, F, 4)
    rows = g * len(nodes)
    rank = req.ranks[:, nodes].T.ravel()
    group = np.tile(np.arange(g), len(nodes))
    fchan = np.repeat(flows[:, None, :, 0], g, 1).reshape(rows, -1)
    peer_pos = np.repeat(flows[:, None, :, 1], g, 1).reshape(rows, -1)
    nflow = fchan.shape[1]
    row_bytes = nbytes[:, nodes].T.ravel()
    cps = op.cps * (row_bytes // req.nbytes)  # a mismatched rank: twice the chunks
    delta = phys.rng.exponential(5e-6, (rows, req.channels))
    return OpBlock(
        rank=rank.astype(np.int32),
        comm=req.comm[group],
        seq=req.seq[group].astype(np.int64),
        kind=np.full(rows, OP_NAMES.index("allreduce"), dtype=np.uint8),
        algo=TREE,
        proto=SIMPLE,
        nbytes=row_bytes,
        issue=req.issue[:, nodes].T.ravel().astype(np.float64),
        times=np.concatenate([times_of[i] for i in nodes]),
        fdir=np.repeat(flows[:, None, :, 2], g, 1).reshape(rows, -1).astype(np.uint8),
        fchan=fchan.astype(np.int16),
        fpeer=req.ranks[group[:, None], peer_pos].astype(np.int32),
        fcps=np.repeat(cps[:, None], nflow, 1).astype(np.int32),
        fdelta=np.take_along_axis(delta, fchan, 1),
        slot=np.zeros(rows, dtype=np.int64),
        host=phys.layout.host_of[rank].astype(np.int32),
        proc_dead=phys.fx.proc_dead[rank],
        profile=np.repeat(flows[:, None, :, 3], g, 1).reshape(rows, -1),
        posted=np.concatenate([r.posts[i] for i in nodes]),
        nccl=phys.hw.counters == "nccl",
    )
