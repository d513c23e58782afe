"""Hang rules for ranks inside the op their peers wait in: what their frozen
flows say.

A rank in the op whose send flows froze with data ready but not sent (G>T),
or whose peers' sends to it froze posted but not acknowledged (T>D), is
where the data stopped: its NIC, unless another flow through the same NIC
moved after it froze. A rank whose flows all stand at G=T=D while it holds
input it has not consumed is its GPU. ``rca_hang`` walks the wait-for graph
to the ranks these rules judge.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mycroft.schemas.vocab import RECV, SEND, Component
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.graph import buffers_full
from mycroft.streams.core.progress import held_ready
from mycroft.streams.core.suspect import Suspect
from mycroft.streams.core.topology import JobTopology

_ALIVE_MARGIN_NS = 1_000_000
"""Same-clock progress this much after a flow froze proves a NIC still works
(channels of one op freeze microseconds apart; a ring step takes ms)."""


_SKEW_MARGIN_NS = 50_000_000
"""Progress this much later on another host's clock counts as later
(clock offsets between hosts stay well below it)."""


def moved_data(flows: np.ndarray) -> np.ndarray:
    """Mask of flows whose data moved: anything staged, sent or done on a
    send flow, anything arrived on a receive flow. A receive flow's G is the
    buffers its proxy posted, which it does at the op's enqueue whether or
    not the GPU ever runs the kernel, and ``last_ns`` stamps that too."""
    out: np.ndarray = np.where(
        flows["dir"] == SEND,
        (flows["gpu_ready"] > 0) | (flows["done"] > 0),
        flows["transmitted"] > 0,
    ) & (flows["last_ns"] > 0)
    return out


def _nic_moved_after(
    flows: np.ndarray, topo: JobTopology, rank: int, t_ns: int, margin_ns: int
) -> bool:
    """Whether a cross-host flow of ``rank`` progressed after ``t_ns``: its
    NIC path still works.

    Only the rank's own flows count: ``last_ns`` also moves when the GPU
    fills a buffer, and a NIC mate's GPU keeps doing that for a while after
    the NIC stopped.
    """
    later = flows[
        (flows["rank"] == rank)
        & (flows["last_ns"] > t_ns + margin_ns)
        & moved_data(flows)
    ]
    host = topo.host_of(rank)
    return any(topo.host_of(int(q)) != host for q in later["peer"].tolist())


def _excess(gap: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Gaps above what is normal among the group's flows (pipelining slack)."""
    base = float(np.median(ref)) if len(ref) else 0.0
    return gap > base + 1


def frozen_ready_not_sent(flows: np.ndarray, frozen_ns: int) -> np.ndarray:
    """Mask of open send flows frozen with data ready but not sent (G > T).

    Frozen: no counter moved for ``frozen_ns`` before the flow's own tick
    (same host clock). In a hang every flow at the blocked point is frozen,
    so any G > T beyond the job's usual pipelining slack (median gap of the
    open send flows, + 1 chunk) is a candidate; whether the cause is local or
    remote is decided by the receiver's state (``_score_in_op``). A producer
    whose send G is at most T + 1 (the NCCL plugin) shows the backlog as its
    head step's ready-wait (``progress.held_ready``).
    """
    open_send = (flows["dir"] == SEND) & (flows["done"] < flows["total"])
    gap = held_ready(flows)
    out: np.ndarray = (
        open_send
        & _excess(gap, gap[open_send])
        & (flows["tick_ns"] - flows["last_ns"] >= frozen_ns)
    )
    return out


def _posted(flows: np.ndarray, send: np.void) -> float:
    """G (buffers posted) of the receive flow that matches ``send``, ``inf``
    when the receiver reported none (unknown counts as posted)."""
    rows = flows[
        (flows["dir"] == RECV)
        & (flows["rank"] == send["peer"])
        & (flows["peer"] == send["rank"])
        & (flows["comm"] == send["comm"])
        & (flows["seq"] == send["seq"])
        & (flows["channel"] == send["channel"])
    ]
    return float(rows["gpu_ready"].max()) if len(rows) else float("inf")


def in_op_keys(flows: np.ndarray) -> set[tuple[int, int, int]]:
    """``(rank, comm, seq)`` of every op that has flow rows (rank is in it)."""
    return set(
        zip(
            flows["rank"].tolist(),
            flows["comm"].tolist(),
            flows["seq"].tolist(),
            strict=True,
        )
    )


def _score_frozen_sends(  # noqa: PLR0913, PLR0917 - private helper of one module
    sus: Suspect,
    flows: np.ndarray,
    gt: np.ndarray,
    gt_mask: np.ndarray,
    present: set[tuple[int, int, int]],
    blame: Callable[[int], Suspect],
    topo: JobTopology,
) -> int:
    """Score ``sus``'s frozen ready-not-sent flows ``gt``; return how many
    have a local cause (its own NIC path)."""
    r = sus.rank
    stuck = set(flows["rank"][gt_mask].tolist())
    # Table 4, G > T: a local cause (the sender's NIC / RDMA path) when the
    # receiver is ready: it is in the same op, posted a buffer beyond what
    # was sent (where its recv flow is seen: a transport with credits posts
    # only into such a buffer) and is not itself stuck with ready-not-sent
    # data. Otherwise the receiver is not ready (remote cause): a receiver
    # that cannot send cannot free its buffers, so credit stalls propagate
    # backwards along a ring.
    n_local = 0
    for f in gt:
        peer, ch = int(f["peer"]), int(f["channel"])
        key = (peer, int(f["comm"]), int(f["seq"]))
        no_credit = _posted(flows, f) <= int(f["transmitted"])
        if peer in stuck or key not in present or no_credit:
            sus.add(
                Rule.SEND_TO_UNREADY,
                f"send flow {r}->{peer} ch {ch} G>T toward a receiver not ready "
                + (
                    "(it posted no buffer for the data: no credit)"
                    if no_credit
                    else "(remote cause)"
                ),
                flow=(peer, ch),
            )
            sus.flow = sus.flow or (peer, ch)
            continue
        # Did this rank's NIC move anything after the flow froze? Then its
        # NIC works and the path's other end (the receiver's NIC) stopped;
        # else the sender's NIC/RDMA path is the local cause.
        froze = int(f["last_ns"])
        cross = topo.host_of(peer) != topo.host_of(r)
        if cross and _nic_moved_after(flows, topo, r, froze, _ALIVE_MARGIN_NS):
            other = blame(peer)
            other.add(
                Rule.RECEIVER_NIC_STOPPED,
                f"rank {r}'s data to rank {peer} froze (G>T) while rank {r}'s "
                "NIC kept working: the receiving NIC stopped",
                flow=(r, ch),
            )
            other.flow = other.flow or (r, ch)
            continue
        n_local += 1
        if sus.flow is None or n_local == 1:
            sus.flow = (peer, ch)
        # A lone transfer cannot tell its two ends apart: unless the
        # receiver's NIC moved data since (another host's clock, so a wider
        # margin), it stays a suspect too.
        if cross and not _nic_moved_after(flows, topo, peer, froze, _SKEW_MARGIN_NS):
            other = blame(peer)
            if Component.NIC not in other.scores:
                other.add(
                    Rule.RECEIVER_NIC_SILENT,
                    f"or the receiving NIC: rank {r}'s data to rank {peer} froze "
                    f"(G>T) and rank {peer}'s NIC moved nothing since",
                    flow=(r, ch),
                )
                other.flow = other.flow or (r, ch)
    return n_local


def score_in_op(  # noqa: PLR0913, PLR0917 - the hang explainer hands in its state
    sus: Suspect,
    flows: np.ndarray,
    group: set[int],
    gt_mask: np.ndarray,
    present: set[tuple[int, int, int]],
    blame: Callable[[int], Suspect],
    topo: JobTopology,
    not_started_ranks: set[int] | None = None,
) -> None:
    r = sus.rank
    mine = flows[flows["rank"] == r]
    sends = mine[(mine["dir"] == SEND) & (mine["done"] < mine["total"])]
    gsend = flows[(flows["dir"] == SEND) & np.isin(flows["rank"], list(group))]
    gt = flows[gt_mask & (flows["rank"] == r)]
    n_local = _score_frozen_sends(sus, flows, gt, gt_mask, present, blame, topo)
    if n_local:
        sus.add(
            Rule.FROZEN_READY_NOT_SENT,
            f"{n_local} send flow(s) frozen ready but not transmitted (G>T) "
            "to a receiver that is ready",
            score=sus.rca.plus(
                Rule.FROZEN_READY_NOT_SENT, n_local / max(len(sends), 1)
            ),
        )
    into = gsend[
        (gsend["peer"] == r)
        & _excess(
            gsend["transmitted"] - gsend["done"], gsend["transmitted"] - gsend["done"]
        )
    ]
    if len(into):
        share = sus.rca.weight(Rule.SENT_NOT_DONE_INTO) * len(into) / max(len(flows), 1)
        sus.add(
            Rule.SENT_NOT_DONE_INTO,
            f"{len(into)} peer send flow(s) to rank {r} transmitted, never done (T>D)",
            score=sus.rca.plus(Rule.SENT_NOT_DONE_INTO, share),
        )
        if sus.flow is None:
            sus.flow = (int(into["rank"][0]), int(into["channel"][0]))
    # Table 4 "not started" (G = T = D = 0): the rank is in the op, its
    # peers moved data in it, yet none of its flows ever progressed: its own
    # GPU never ran the kernel (local cause), unlike a rank blocked upstream,
    # which still moves its own step-0 data. A rank that only receives has
    # no data of its own (its proxy receives whether or not its kernel runs;
    # a kernel that never ran leaves what arrived unconsumed, below).
    if (
        len(mine)
        and not bool(moved_data(mine).any())
        and n_local == 0
        and bool((mine["dir"] == SEND).any())
    ):
        keys = set(zip(mine["comm"].tolist(), mine["seq"].tolist(), strict=True))
        peers_moved = any(
            (c, q) in keys and did
            for c, q, did, rr in zip(
                flows["comm"].tolist(),
                flows["seq"].tolist(),
                moved_data(flows).tolist(),
                flows["rank"].tolist(),
                strict=True,
            )
            if rr != r
        )
        if peers_moved:
            sus.add(
                Rule.NEVER_MOVED,
                f"rank {r} is in the op but never moved a chunk while its "
                "peers did (G=T=D=0: kernel never ran)",
            )
            return
    recv = mine[mine["dir"] == RECV]
    not_started = not_started_ranks or set()
    waits_on_unstarted = bool(
        len(sends) and np.isin(sends["peer"], list(not_started)).any()
    )
    # Sends of its own frozen ready-not-sent (G>T) explain unconsumed input:
    # output that cannot drain back-pressures the kernel.
    if len(recv) and not len(gt) and not waits_on_unstarted:
        # Table 4 "GPU not ready" (G = T = D frozen) seen against the input:
        # input arrived (transmitted) that its own kernel never consumed
        # (done), and either it received more than it turned into output (a
        # ring's step) or every buffer it posted for some sender is filled
        # with such input (G = T > D on a recv flow: that sender can put
        # nothing more, whatever the algorithm; a tree's node sends up more
        # than it received). Input all consumed is a rank waiting for more
        # (e.g. behind a dead link), not a stuck GPU.
        total = max(float(recv["total"].sum()), 1.0)
        held = float((recv["transmitted"] - recv["done"]).sum()) / total
        got = float(recv["transmitted"].sum()) / total
        made = (
            float(sends["gpu_ready"].sum()) / max(float(sends["total"].sum()), 1.0)
            if len(sends)
            else 0.0
        )
        full = buffers_full(recv)
        sus.consider(Component.GPU)
        if held > 0 and (got > made or bool(full.any())):
            why = "" if got > made else f"; {int(full.sum())} recv flow(s) full"
            sus.add(
                Rule.UNCONSUMED_INPUT,
                f"holds input it did not consume (arrived {got:.0%}, "
                f"consumed {got - held:.0%}, produced {made:.0%}{why}; "
                "G=T=D frozen)",
                score=sus.rca.unconsumed_score(got, min(made, got), held),
            )
