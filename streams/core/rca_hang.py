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

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from mycroft.schemas.records import Culprit, Evidence
from mycroft.schemas.vocab import RECV, SEND, Component, FaultKind
from mycroft.streams.core.detect import DetectContext, lost_ranks
from mycroft.streams.core.graph import build_wait_graph, terminal_groups


@dataclass
class Suspect:
    """Accumulated evidence against one rank."""

    rank: int
    scores: dict[Component, float] = field(default_factory=dict)
    flow: tuple[int, int] | None = None  # (peer, channel)
    reasons: list[str] = field(default_factory=list)

    def add(self, comp: Component, score: float, reason: str) -> None:
        """Add ``score`` for ``comp`` with a human reason."""
        self.scores[comp] = self.scores.get(comp, 0.0) + score
        self.reasons.append(reason)

    @property
    def best(self) -> tuple[Component, float]:
        """Return the highest-scored component and its score."""
        comp = max(self.scores, key=lambda c: self.scores[c])
        return comp, self.scores[comp]


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
    gt = sends[
        _excess(
            sends["gpu_ready"] - sends["transmitted"],
            flows["gpu_ready"] - flows["transmitted"],
        )
    ]
    nic_mates = ctx.topo.ranks_on_nic(sus.rank)
    host_mates = ctx.topo.ranks_on_host(ctx.topo.host_of(sus.rank))
    if len(gt):
        first = gt[np.argmin(gt["last_ns"])]
        sus.flow = (int(first["peer"]), int(first["channel"]))
        sus.add(
            Component.NIC,
            2.0,
            f"last send flows frozen ready-not-sent (G>T) "
            f"on {len(gt)} flow(s) before rank {sus.rank} went silent",
        )
    elif len(nic_mates) > 1 and set(nic_mates) <= lost and not set(host_mates) <= lost:
        sus.add(Component.NIC, 1.5, f"every rank on NIC of rank {sus.rank} went silent")
    elif how == "host":
        sus.add(
            Component.HOST, 1.5, f"host {ctx.topo.host_of(sus.rank)} stopped reporting"
        )
        sus.add(Component.NIC, 0.5, "host unreachable: its NIC may be down")
    elif not _in_op(ctx, sus.rank):
        # Everything it issued completed and it issued nothing since, while
        # its host still reports: the CPU side stopped feeding the GPU (a
        # stalled host thread, data loader, checkpoint...). A process that
        # died mid-op instead leaves issued > done behind.
        sus.add(
            Component.HOST,
            2.0,
            f"rank {sus.rank} completed all it issued and issued nothing "
            f"since ({how} stale) while peers wait in its next op",
        )
        sus.add(Component.PROCESS, 1.0, "an idle process may also have died")
    else:
        sus.add(
            Component.PROCESS,
            2.0,
            f"rank {sus.rank}'s records stopped ({how}) "
            "while its host still reports and peers wait",
        )


def _in_op(ctx: DetectContext, rank: int) -> bool:
    """Whether ``rank``'s rank-state says it has an op issued and not done."""
    s = ctx.store.slots
    m = s["rank"] == rank
    return bool((s["issued"][m] > s["done"][m]).any())


def _excess(gap: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Gaps above what is normal among the group's flows (pipelining slack)."""
    base = float(np.median(ref)) if len(ref) else 0.0
    return gap > base + 1


def stuck_senders(flows: np.ndarray, group: set[int]) -> set[int]:
    """Ranks of ``group`` with open send flows frozen ready-not-sent (G>T).

    "Beyond the group's normal gap": the median G-T of the group's send
    flows is pipelining slack, not a symptom.
    """
    gsend = flows[
        (flows["dir"] == SEND)
        & (flows["done"] < flows["total"])
        & np.isin(flows["rank"], list(group))
    ]
    gap = gsend["gpu_ready"] - gsend["transmitted"]
    return set(gsend["rank"][_excess(gap, gap)].tolist())


def _score_in_op(
    sus: Suspect, flows: np.ndarray, group: set[int], stuck: set[int]
) -> None:
    r = sus.rank
    mine = flows[flows["rank"] == r]
    sends = mine[(mine["dir"] == SEND) & (mine["done"] < mine["total"])]
    gsend = flows[(flows["dir"] == SEND) & np.isin(flows["rank"], list(group))]
    gt = sends[
        _excess(
            sends["gpu_ready"] - sends["transmitted"],
            gsend["gpu_ready"] - gsend["transmitted"],
        )
    ]
    # Table 4, G > T: local cause (the sender's NIC/RDMA) when the receiver
    # is ready, i.e. not itself stuck with ready-not-sent data; a receiver
    # that is stuck cannot free its buffers (remote cause: the credit stall
    # propagates backwards along the ring), so such flows are weak evidence.
    local = gt[~np.isin(gt["peer"], list(stuck))] if stuck else gt
    if len(local):
        worst = local[np.argmax(local["gpu_ready"] - local["transmitted"])]
        sus.flow = (int(worst["peer"]), int(worst["channel"]))
        sus.add(
            Component.NIC,
            1.0 + len(local) / max(len(sends), 1),
            f"{len(local)} send flow(s) ready but not transmitted (G>T) "
            "to a receiver that is ready",
        )
    elif len(gt):
        worst = gt[np.argmax(gt["gpu_ready"] - gt["transmitted"])]
        sus.flow = (int(worst["peer"]), int(worst["channel"]))
        sus.add(
            Component.NIC,
            0.3,
            f"{len(gt)} send flow(s) G>T toward receiver(s) that are stuck "
            "themselves (receiver not ready: remote cause)",
        )
    into = gsend[
        (gsend["peer"] == r)
        & _excess(
            gsend["transmitted"] - gsend["done"], gsend["transmitted"] - gsend["done"]
        )
    ]
    if len(into):
        sus.add(
            Component.NIC,
            0.5 + 0.5 * len(into) / max(len(flows), 1),
            f"{len(into)} peer send flow(s) to rank {r} transmitted, never done (T>D)",
        )
        if sus.flow is None:
            sus.flow = (int(into["rank"][0]), int(into["channel"][0]))
    recv = mine[mine["dir"] == RECV]
    if len(sends) and not len(gt):
        got = float(recv["done"].sum()) / max(float(recv["total"].sum()), 1.0)
        made = float(sends["gpu_ready"].sum()) / max(float(sends["total"].sum()), 1.0)
        sus.scores.setdefault(Component.GPU, 0.0)
        sus.scores[Component.GPU] += max(got - made, 0.0) * 4.0
        if got - made > 0:
            sus.reasons.append(
                f"holds input it did not turn into output "
                f"(received {got:.0%}, produced {made:.0%}; G=T=D frozen)"
            )


def _first_stop_bonus(suspects: dict[int, Suspect], flows: np.ndarray) -> None:
    stops: dict[int, int] = {}
    for r in suspects:
        mine = flows[(flows["rank"] == r) & (flows["done"] < flows["total"])]
        if len(mine):
            stops[r] = int(mine["last_ns"].max())
    if len(stops) < 2:
        return
    order = sorted(stops, key=lambda r: stops[r])
    first, second = order[0], order[1]
    if stops[second] - stops[first] > 5_000_000:  # beyond clock offset tolerance
        sus = suspects[first]
        sus.scores.setdefault(Component.GPU, 0.0)
        comp = max(sus.scores, key=lambda c: sus.scores[c])
        sus.add(
            comp,
            0.75,
            f"rank {first} stopped progressing first "
            f"({(stops[second] - stops[first]) / 1e6:.0f} ms before the next)",
        )


def explain_hang(
    ctx: DetectContext, symptom_ranks: set[int], now_ns: int
) -> tuple[list[Culprit], list[Evidence]]:
    """Return culprits (best first) and the evidence chain of a hang."""
    lost_info = lost_ranks(ctx, now_ns)
    lost = set(lost_info)
    g = build_wait_graph(ctx.store, ctx.topo, lost)
    start = symptom_ranks | lost
    groups = terminal_groups(g, start) or [set(symptom_ranks)]
    flows = ctx.store.latest_flows()
    s = ctx.store.slots
    busy_ranks = set(s["rank"][s["issued"] > s["done"]].tolist())
    suspects: dict[int, Suspect] = {}
    evidence: list[Evidence] = []
    for group in groups:
        stuck = stuck_senders(flows, group)
        if (
            len(group) == 1
            and next(iter(group)) not in lost | busy_ranks
            and g.in_degree(next(iter(group))) == 0
        ):
            continue  # an idle rank nobody waits on is no suspect
        for r in sorted(group):
            sus = suspects.setdefault(r, Suspect(r))
            if r in lost:
                _score_lost(ctx, sus, lost_info[r][0], flows, lost)
            elif r not in busy_ranks:
                waiters = sorted(g.predecessors(r))
                sus.add(
                    Component.HOST,
                    2.0,
                    f"rank {r} is alive but never issued the "
                    f"op ranks {waiters[:8]} wait in",
                )
            else:
                _score_in_op(sus, flows, group, stuck)
    _first_stop_bonus({r: v for r, v in suspects.items() if r not in lost}, flows)
    evidence.extend(_chain(g, start, suspects))
    return _rank(ctx, suspects, FaultKind.HANG), evidence


def _chain(
    g: nx.DiGraph, start: set[int], suspects: dict[int, Suspect]
) -> list[Evidence]:
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


def _rank(
    ctx: DetectContext, suspects: dict[int, Suspect], kind: FaultKind
) -> list[Culprit]:
    scored = [(sus.best, sus) for sus in suspects.values() if sus.scores]
    scored = [x for x in scored if x[0][1] > 0] or scored
    total = sum(max(sc, 0.0) for (_, sc), _ in scored) or 1.0
    scored.sort(key=lambda x: (-x[0][1], x[1].rank))
    out: list[Culprit] = []
    for (comp, sc), sus in scored[:8]:
        with_flow = comp in (Component.NIC, Component.NETWORK, Component.PROXY)
        peer, ch = sus.flow if (sus.flow and with_flow) else (None, None)
        out.append(
            Culprit(
                rank=sus.rank,
                host=ctx.topo.host_of(sus.rank),
                component=comp,
                kind=kind,
                confidence=round(min(0.99, max(sc, 0.0) / total), 3),
                peer=peer,
                channel=ch,
                reason="; ".join(sus.reasons[:3]),
            )
        )
    return out
