"""Naming the part flagged cross-host flows share: the helpers of the link
rules (``link_rules``: T-D lag; ``link_backlog``: G-T backlog).

A flagged flow counts at both ends (:func:`weights`); a verdict names one
rank of the part with the flow that shows it best (:func:`blame_flow`), a
host's network path (:func:`blame_hosts`), or the one GPU most of the
excess drains into (:func:`drains_into_one_gpu`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from mycroft.schemas.vocab import Component
from mycroft.streams.core.backlog_receiver import common_receiver
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.flow_features import FlowFeatures
from mycroft.streams.core.scoring import PROXY_FREEZE_EPISODES, WEIGHTS
from mycroft.streams.core.suspect import Suspects

K = TypeVar("K")

LinkFlag = tuple[FlowFeatures, float]
"""A cross-host send flow whose counter gap left its role's band, and by how
many chunks (value minus the role's median)."""


def weights(
    flags: list[LinkFlag], key: Callable[[int], K]
) -> dict[K, tuple[int, int, float]]:
    """Per ``key`` of either end of the flagged flows: how many touch it, how
    many of those it sends, and their summed excess."""
    out: dict[K, tuple[int, int, float]] = {}
    for f, ex in flags:
        src = key(f.rank)
        for k in {src, key(f.peer)}:
            n, sent, w = out.get(k, (0, 0, 0.0))
            out[k] = (n + 1, sent + (k == src), w + ex)
    return out


def blame_flow(  # noqa: PLR0913 - the rule, its score and its words
    ctx: DetectContext,
    suspects: Suspects,
    flags: list[LinkFlag],
    flows: list[FlowFeatures],
    ranks: Sequence[int],
    *,
    rule: Rule,
    score: float,
    why: str,
) -> None:
    """Name ``rule``'s component on the rank of ``ranks`` with the worst
    flagged send flow, with that flow.

    Without one: its worst cross-host send flow, else the worst flagged flow
    into it (named from the culprit's end: ``rank -> sender``). A NIC, a
    proxy and the network carry only traffic between hosts, so the flow
    named is never one to a GPU of the same host.
    """
    host_of = ctx.topo.host_of
    own = [(f, ex) for f, ex in flags if f.rank in ranks]
    into = [(f, ex) for f, ex in flags if f.peer in ranks]
    mine = [
        f
        for f in flows
        if f.rank in ranks and f.started and host_of(f.rank) != host_of(f.peer)
    ]
    if own:
        flow = max(own, key=lambda x: (x[1], -x[0].rank))[0]
        rank, peer = flow.rank, flow.peer
    elif mine:
        flow = max(mine, key=lambda f: (f.gt_chunks + f.td_chunks, -f.rank))
        rank, peer = flow.rank, flow.peer
    elif into:
        flow = max(into, key=lambda x: (x[1], -x[0].peer))[0]
        rank, peer = flow.peer, flow.rank
    else:
        return
    nic = WEIGHTS[rule].component is Component.NIC
    if nic and rank == flow.rank and 0 < flow.episodes <= PROXY_FREEZE_EPISODES:
        rule = Rule.PROXY_FREEZE
        why += f"; T froze in {flow.episodes} long episode(s): the send proxy"
    sus = suspects.at(rank)
    sus.add(rule, why, score=score, flow=(peer, flow.channel))
    sus.flow = (peer, flow.channel)


TIED_HOSTS = 4
"""Most hosts named for one network verdict when they are tied for the
most flagged flows (the first congested flows into a switch touch the
two senders' hosts and the two receivers' hosts alike)."""


def drains_into_one_gpu(
    ctx: DetectContext,
    suspects: Suspects,
    flags: list[LinkFlag],
    rule: Rule,
    gap: str,
) -> bool:
    """Name ``rule`` (pcie) on the GPU most of ``flags``' excess drains into
    from several NICs, its NIC mates receiving normally
    (``backlog_receiver.common_receiver``); whether there is one."""
    rx = common_receiver(ctx.topo, flags)
    if rx is None:
        return False
    suspects.at(rx.rank).add(
        rule,
        f"{rx.flows} flows into rank {rx.rank} from {rx.senders} NICs hold "
        f"{rx.share:.0%} of the {gap} while its NIC mates receive normally: "
        "its receive path (PCIe) does not drain",
        score=suspects.rca.link_score(rule, rx.flows),
    )
    return True


def blame_hosts(
    ctx: DetectContext,
    suspects: Suspects,
    flags: list[LinkFlag],
    flows: list[FlowFeatures],
    *,
    rule: Rule,
    why: Callable[[str, int], str],
) -> None:
    """``rule`` (network) on the host that most flagged flows touch; hosts tied with it
    (the two ends of the same flows, or two pairs of hosts across one
    switch) are named too, weaker, up to ``TIED_HOSTS``: a tie is
    ambiguity, and the top culprit's confidence says so (a later answer
    from more flows can revise it)."""
    hosts = weights(flags, ctx.topo.host_of)
    most = max(n for n, _, _ in hosts.values())
    tops = sorted(
        (h for h, (n, _, _) in hosts.items() if n == most),
        key=lambda h: (-hosts[h][1], -hosts[h][2], h),
    )
    rca = suspects.rca
    for i, host in enumerate(tops[:TIED_HOSTS]):
        blame_flow(
            ctx,
            suspects,
            flags,
            flows,
            ctx.topo.ranks_on_host(host),
            rule=rule,
            score=rca.link_score(rule, len(flags)) * (rca.ambiguous_end if i else 1.0),
            why=why(host, most),
        )
