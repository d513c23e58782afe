"""Root cause of a hang: walk the wait-for graph, then Table 4 on the sink.

Component rules at the earliest blocked point (G/T/D = gpu_ready,
transmitted, done of the frozen flows):

* lost rank, its host still reporting, no G>T on its send flows -> process
* lost rank(s) whose send flows were frozen at G>T, or a whole NIC lost -> nic
* a whole host lost without that evidence -> host
* alive rank that never issued the op its peers wait in, idle elsewhere -> host
* rank in the op, send flows G>T frozen, or peers' sends to it T>D -> nic
* rank in the op, G=T=D frozen while it holds input it has not consumed -> gpu
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import networkx as nx
import numpy as np

from mycroft.schemas.records import Culprit, Evidence
from mycroft.schemas.text import comm_hex, iso
from mycroft.schemas.vocab import RECV, SEND, Component, FaultKind
from mycroft.streams.core.detect import DetectContext, hung_since_ns, lost_ranks
from mycroft.streams.core.escalation import consequences
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.graph import build_wait_graph, terminal_groups
from mycroft.streams.core.hang_in_op import (
    frozen_ready_not_sent,
    in_op_keys,
    moved_data,
    score_in_op,
)
from mycroft.streams.core.rca_ports import nominate_far_ends, score_port_events
from mycroft.streams.core.scoring import PEERS
from mycroft.streams.core.suspect import Suspect, Suspects, rank_suspects
from mycroft.streams.core.topology import JobTopology

FIRST_STOP_LEAD_NS = 5_000_000
"""A suspect stopped first when the next one stopped this much later: beyond
the clock offsets between hosts."""


def _frozen_send(flows: np.ndarray, rank: int) -> np.ndarray:
    out: np.ndarray = flows[
        (flows["rank"] == rank)
        & (flows["dir"] == SEND)
        & (flows["done"] < flows["total"])
    ]
    return out


def _score_lost(
    ctx: DetectContext, sus: Suspect, how: str, flows: np.ndarray, lost: set[int]
) -> None:
    sends = _frozen_send(flows, sus.rank)
    gt = sends[sends["gpu_ready"] > sends["transmitted"]]
    nic_mates = ctx.topo.ranks_on_nic(sus.rank)
    host_mates = ctx.topo.ranks_on_host(ctx.topo.host_of(sus.rank))
    if len(gt):
        first = gt[np.argmin(gt["last_ns"])]
        sus.flow = (int(first["peer"]), int(first["channel"]))
        sus.add(
            Rule.LOST_FROZEN_SEND,
            f"last send flows frozen ready-not-sent (G>T) "
            f"on {len(gt)} flow(s) before rank {sus.rank} went silent",
            flow=sus.flow,
        )
    elif len(nic_mates) > 1 and set(nic_mates) <= lost and not set(host_mates) <= lost:
        sus.add(
            Rule.NIC_ALL_RANKS_LOST, f"every rank on NIC of rank {sus.rank} went silent"
        )
    elif how == "host":
        sus.add(
            Rule.HOST_STOPPED, f"host {ctx.topo.host_of(sus.rank)} stopped reporting"
        )
        sus.add(Rule.HOST_STOPPED_NIC, "host unreachable: its NIC may be down")
    elif not _in_op(ctx, sus.rank):
        # Everything it issued completed and it issued nothing since, but
        # its own liveness beat (rc seen_ns) went stale or its rows vanished
        # while its host still reports: the process died between ops. (An
        # alive-but-idle rank that never issued the op keeps beating: that
        # is the host-side stall scored in explain_hang.)
        sus.add(
            Rule.DIED_IDLE,
            f"rank {sus.rank} completed all it issued, then its liveness "
            f"beat stopped ({how} stale) while peers wait in its next op: "
            "the process died while idle",
        )
        sus.add(Rule.DIED_IDLE_HOST, "or its host thread stopped feeding it")
    else:
        sus.add(
            Rule.RECORDS_STOPPED,
            f"rank {sus.rank}'s records stopped ({how}) "
            "while its host still reports and peers wait",
        )


def _in_op(ctx: DetectContext, rank: int) -> bool:
    """Whether ``rank``'s rank-state says it has an op issued and not done."""
    s = ctx.store.slots
    m = s["rank"] == rank
    return bool((s["issued"][m] > s["done"][m]).any())


def _score_unresolved(  # noqa: PLR0913, PLR0917 - private helper of one module
    group: set[int],
    suspects: Suspects,
    unstarted: set[int],
    blame: Callable[[int], Suspect],
    flows: np.ndarray,
    topo: JobTopology,
) -> None:
    """Ranks that wait on each other in an op none of them moved data in.

    A two-rank ring (tensor parallel 2) whose GPU hangs before the op leaves
    both ends at G = T = D = 0: each waits for the other's first chunk, and
    no peer outside the pair moved data to tell the dead kernel from the
    live one. On a same-host transport (NVLink, PCIe P2P, shared memory)
    there is no proxy: a receive buffer is offered by the receiving kernel
    itself, so a rank whose same-host receive flows offered buffers (G > 0)
    runs the kernel and one whose did not does not (``NO_BUFFER_OFFERED``).
    Without that, every such rank is named, equally (the confidence says
    the counters cannot choose), as a kernel that never ran.
    """
    if len(group) < PEERS or not group <= unstarted:
        return
    if any(
        suspects[r].best[1] > 0 for r in group if r in suspects and suspects[r].scores
    ):
        return
    live, dead = _buffers_offered(flows, group, topo)
    if live and dead:
        for r in sorted(dead):
            blame(r).add(
                Rule.NO_BUFFER_OFFERED,
                f"rank {r} offered no receive buffer in the op while ranks "
                f"{sorted(live)[:8]} of its host did (same-host transports are "
                "driven by the kernels, not a proxy): its kernel never ran",
            )
        return
    for r in sorted(group):
        blame(r).add(
            Rule.MUTUAL_UNSTARTED,
            f"ranks {sorted(group)[:8]} wait on each other in an op none of "
            "them moved a chunk in (G=T=D=0 on every flow): one of their "
            "kernels never ran; the counters cannot tell which",
        )


def _buffers_offered(
    flows: np.ndarray, group: set[int], topo: JobTopology
) -> tuple[set[int], set[int]]:
    """Ranks of ``group`` whose open same-host receive flows offered
    buffers (G > 0), and those whose offered none."""
    live: set[int] = set()
    dead: set[int] = set()
    recv = flows[(flows["dir"] == RECV) & (flows["done"] < flows["total"])]
    for r in sorted(group):
        mine = recv[recv["rank"] == r]
        near = [
            int(g)
            for g, p in zip(
                mine["gpu_ready"].tolist(), mine["peer"].tolist(), strict=True
            )
            if topo.host_of(p) == topo.host_of(r)
        ]
        if near:
            (live if max(near) > 0 else dead).add(r)
    return live, dead


def _first_stop_bonus(suspects: Mapping[int, Suspect], flows: np.ndarray) -> None:
    stops: dict[int, int] = {}
    open_moved = flows[(flows["done"] < flows["total"]) & moved_data(flows)]
    for r in suspects:
        mine = open_moved[open_moved["rank"] == r]
        if len(mine):
            stops[r] = int(mine["last_ns"].max())
    if len(stops) < PEERS:
        return
    order = sorted(stops, key=lambda r: stops[r])
    first, second = order[0], order[1]
    if stops[second] - stops[first] > FIRST_STOP_LEAD_NS:
        sus = suspects[first]
        sus.consider(Component.GPU)
        sus.add(
            Rule.FIRST_TO_STOP,
            f"rank {first} stopped progressing first "
            f"({(stops[second] - stops[first]) / 1e6:.0f} ms before the next)",
            component=sus.best[0],
        )


def _score_order_cycle(
    ctx: DetectContext,
    g: nx.DiGraph,
    group: set[int],
    exclude: set[int],
    blame: Callable[[int], Suspect],
) -> None:
    """Cross-group order deadlock: a cycle of "never issued" control edges
    over >= 2 comms, every member alive and busy. Each rank is blocked in
    the comm it issued first among the cycle's comms; the ranks whose issue
    order differs from the majority's are blamed (component host: the
    application issued the collectives in another order on those ranks).
    A tie names nobody.
    """
    if len(group) < PEERS or group & exclude:
        return
    edges = [(u, v, d) for u, v, d in g.edges(data=True) if u in group and v in group]
    if not edges or any(d["kind"] != "control" for _, _, d in edges):
        return
    comms = {int(d["comm"]) for _, _, d in edges}
    if len(comms) < PEERS:
        return
    blocked: dict[int, frozenset[int]] = {}
    for u, _, d in edges:
        blocked[u] = blocked.get(u, frozenset()) | {int(d["comm"])}
    classes: dict[frozenset[int], list[int]] = {}
    for r, cs in blocked.items():
        classes.setdefault(cs, []).append(r)
    if len(classes) < PEERS:
        return
    sizes = sorted(len(v) for v in classes.values())
    if sizes[-1] == sizes[-2]:
        return  # no majority order
    major = max(classes, key=lambda c: len(classes[c]))
    ops = ctx.store.in_flight_ops()
    for cs, ranks in classes.items():
        if cs == major:
            continue
        for r in ranks:
            mine = ops[(ops["rank"] == r) & np.isin(ops["comm"], list(comms))]
            first = int(mine["issue_ns"].min()) if len(mine) else None
            when = f" (issued at {iso(first)})" if first is not None else ""
            blame(r).add(
                Rule.ORDER_CYCLE,
                f"order deadlock: rank {r} issued comm {comm_hex(min(cs))}'s op first"
                f"{when}, while ranks {sorted(classes[major])[:8]} issued comm "
                f"{comm_hex(min(major))}'s first; each waits in an op the other side "
                "never issued",
            )


def explain_hang(
    ctx: DetectContext,
    symptom_ranks: set[int],
    now_ns: int,
    since_ns: int | None = None,
) -> tuple[list[Culprit], list[Evidence]]:
    """Return culprits (best first) and the evidence chain of a hang.

    ``since_ns`` is the incident's onset (NIC port events from about then on
    are read); default: the flow history's start, ``now_ns - history_ns``.
    """
    lost_info = lost_ranks(ctx, now_ns)
    lost = set(lost_info)
    teardown = consequences(ctx, lost_info, hung_since_ns(ctx))
    g = build_wait_graph(ctx.store, ctx.topo, lost)
    start = symptom_ranks | lost
    groups = terminal_groups(g, start) or [set(symptom_ranks)]
    flows = ctx.store.latest_flows()
    s = ctx.store.slots
    busy_ranks = set(s["rank"][s["issued"] > s["done"]].tolist())
    suspects = Suspects(ctx.cfg.rca)
    evidence: list[Evidence] = []
    gt_mask = frozen_ready_not_sent(flows, int(ctx.cfg.hang_min_s * 1e9 / 2))
    present = in_op_keys(flows)
    moved = set(flows["rank"][moved_data(flows)].tolist())
    unstarted = set(flows["rank"].tolist()) - moved

    def blame(rank: int) -> Suspect:
        return suspects.at(rank)

    for group in groups:
        if (
            len(group) == 1
            and next(iter(group)) not in lost | busy_ranks
            and g.in_degree(next(iter(group))) == 0
        ):
            continue  # an idle rank nobody waits on is no suspect
        for r in sorted(group - teardown):  # stopped after a peer had: no cause
            sus = suspects.at(r)
            if r in lost:
                _score_lost(ctx, sus, lost_info[r][0], flows, lost)
            elif r not in busy_ranks:
                waiters = sorted(g.predecessors(r))
                sus.add(
                    Rule.NEVER_ISSUED,
                    f"rank {r} is alive but never issued the "
                    f"op ranks {waiters[:8]} wait in",
                )
            else:
                score_in_op(
                    sus,
                    flows,
                    group,
                    gt_mask,
                    present,
                    blame,
                    ctx.topo,
                    unstarted,
                )
    for group in groups:
        _score_order_cycle(ctx, g, group, lost | (group - busy_ranks), blame)
        _score_unresolved(group, suspects, unstarted, blame, flows, ctx.topo)
    _first_stop_bonus({r: v for r, v in suspects.items() if r not in lost}, flows)
    since = now_ns - ctx.cfg.history_ns if since_ns is None else since_ns
    nominate_far_ends(ctx, suspects, flows, since)
    score_port_events(ctx, suspects, since)
    evidence.extend(_chain(g, start, suspects))
    return rank_suspects(ctx.topo, suspects, FaultKind.HANG), evidence


def _chain(g: nx.DiGraph, start: set[int], suspects: Suspects) -> list[Evidence]:
    out: list[Evidence] = []
    for target in sorted(suspects)[:3]:
        for src in sorted(start):
            if src != target and src in g and nx.has_path(g, src, target):
                path = nx.shortest_path(g, src, target)
                for u, v in zip(path, path[1:], strict=False):
                    e = g.edges[u, v]
                    out.append(
                        Evidence(
                            f"rank {u} waits on rank {v} ({e['kind']}: {e['why']})",
                            u,
                            e["comm"],
                            e["seq"],
                        )
                    )
                break
        for why in suspects[target].reasons:
            out.append(Evidence(why, target))
    return out
