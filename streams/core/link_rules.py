"""Link evidence of a slowdown: G/T/D gaps of cross-host flows, attributed
to the part the flagged flows share.

| flagged flows                                                  | component |
|----------------------------------------------------------------|-----------|
| T-D (sent, not acked) mostly into one GPU, from >= 2 NICs      | pcie      |
| T-D on every GPU's flows through one NIC, another NIC of its   | nic       |
| host moving data normally                                      |           |
| T-D otherwise: the host most of them touch                     | network   |
| G-T (ready, not sent) spread over >= 3 NICs, none on half      | network   |
| G-T on flows through one NIC, some sent by it                  | nic       |
| ... its flows' T froze in 1-2 long (>= 0.3 s) episodes         | proxy     |
| ... all sent by one GPU, its NIC mate sending normally         | proxy     |
| G-T only on flows into one GPU, from >= 2 NICs                 | pcie      |
| G-T from one GPU to one GPU: T seen stopping                   | (sender)  |
| ... T seen draining, never stopping, sender's NIC mate clean   | pcie (rx) |

Gaps are judged in chunks against the role's pooled healthy baseline
(learned by the ``slow_td`` detector); each flagged flow counts at both
ends. ``streams/core/README.md`` (slowdown) explains each row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

import numpy as np
from scipy.stats import binom

from mycroft.schemas.vocab import Component
from mycroft.streams.core.backlog_receiver import common_receiver
from mycroft.streams.core.baseline import outliers
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.detect_slow import gap_floor, role_gap_baseline
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.flow_features import FlowFeatures
from mycroft.streams.core.scoring import (
    AMBIGUOUS_END,
    MAJORITY,
    PEERS,
    PROXY_FREEZE_EPISODES,
    WEIGHTS,
    link_score,
)
from mycroft.streams.core.suspect import Suspect

K = TypeVar("K")


LinkFlag = tuple[FlowFeatures, float]
"""A cross-host send flow whose counter gap left its role's band, and by how
many chunks (value minus the role's median)."""


def _flag_gaps(
    ctx: DetectContext, flows: list[FlowFeatures], gap: str
) -> list[LinkFlag]:
    """Return the cross-host flows whose ``gap`` (``"gt"`` = G-T, ``"td"`` =
    T-D; worst op's median, chunks) is out of their role's band.

    The band is the role's pooled healthy baseline (learned by the detector
    from completed ops) when warm, else the role's peers in this window.
    """
    cfg, topo = ctx.cfg, ctx.topo
    floor = cfg.gap_floor_chunks
    by_comm: dict[int, list[int]] = {}
    for i, f in enumerate(flows):
        if f.started and topo.host_of(f.rank) != topo.host_of(f.peer):
            by_comm.setdefault(f.comm, []).append(i)
    out: list[LinkFlag] = []
    peers: dict[str, dict[int, float]] = {}
    for comm, idx in by_comm.items():
        base = role_gap_baseline(ctx, comm, gap)
        if len(base.values) < cfg.warmup_samples:
            info = topo.comms.get(comm)
            role = peers.setdefault(info.role if info else "other", {})
            role.update({i: getattr(flows[i], f"{gap}_chunks") for i in idx})
            continue
        cut, med = base.threshold(cfg, gap_floor(base, cfg)), base.stats()[0]
        healthy = np.asarray(base.ordered)
        rate = max(int((healthy > cut).sum()), 1) / (len(healthy) + 1)
        for i in idx:
            v = getattr(flows[i], f"{gap}_chunks")
            if v > cut and (
                gap != "td"
                or _beyond_chance(flows[i].td_ops, cut, rate, cfg.gap_chance_max)
            ):
                out.append((flows[i], v - med))
    for vals in peers.values():
        out.extend((flows[i], ex) for i, ex in outliers(vals, floor).items())
    return out


def _beyond_chance(ops: Sequence[float], cut: float, rate: float, alpha: float) -> bool:
    """Whether more of a flow's ops had T-D above the band than healthy ops.

    T-D is what is posted and not yet completed: under credits it is bounded
    by the slots and sits at one or two of them whenever the flow streams,
    so a slow wire cannot hold more than a healthy busy one, and the worst
    of many healthy ops is above the band's 95th percentile. A wire is slow
    when more of its ops are above the band than chance allows: the count's
    binomial tail at ``rate`` (the healthy samples' own share above it) is
    below ``alpha``. Without per-op values (features built by hand) the
    worst op decides.
    """
    if not ops:
        return True
    k = int((np.asarray(ops) > cut).sum())
    return bool(binom.sf(k - 1, len(ops), rate) < alpha)


def _weights(
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


def _blame_flow(  # noqa: PLR0913 - private helper of one module
    ctx: DetectContext,
    suspects: dict[int, Suspect],
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
    sus = suspects.setdefault(rank, Suspect(rank))
    sus.add(rule, why, score=score, flow=(peer, flow.channel))
    sus.flow = (peer, flow.channel)


TIED_HOSTS = 4
"""Most hosts named for one network verdict when they are tied for the
most flagged flows (the first congested flows into a switch touch the
two senders' hosts and the two receivers' hosts alike)."""


def score_links(
    ctx: DetectContext,
    suspects: dict[int, Suspect],
    flows: list[FlowFeatures],
) -> None:
    """G/T/D over cross-host flows, attributed to the part they share.

    * T-D (sent, not acknowledged) out of band: the smallest part every
      lagging flow shares (``_score_lag``): one GPU they drain into (its
      PCIe), one NIC (with another NIC of its host moving data normally),
      else the network path of the host most of them touch;
    * G-T (ready, not sent) out of band, on flows whose receiver had posted
      the buffers (the part waiting on its credit is not counted), spread
      over many NICs, none on most of them: the network between them
      (switch-level congestion), on the host most of them touch;
    * ... else per NIC touched by the most flagged flows: sending on them,
      that NIC (proxy if T froze in 1-2 long episodes, or if one GPU sends
      them all while its NIC mate sends normally); only receiving them
      into one GPU from several NICs, that GPU's receive path does not drain
      (PCIe); receiving into both GPUs, the NIC. A tie (one NIC pair, one
      sender-receiver pair) names both ends, the receiving one weaker.
    """
    lag = _flag_gaps(ctx, flows, "td")
    if lag:
        _score_lag(ctx, suspects, flows, lag)
    # G-T here is the part the receiver had posted buffers for: a backlog
    # waiting on the receiver's credit is the receiver's, which its timing
    # shows (``FlowFeatures.wait_chunks``).
    backlog = _flag_gaps(ctx, flows, "gt")
    if backlog:
        _score_backlog(ctx, suspects, flows, backlog)


def _score_lag(
    ctx: DetectContext,
    suspects: dict[int, Suspect],
    flows: list[FlowFeatures],
    lag: list[LinkFlag],
) -> None:
    """T-D out of band, on the smallest part every lagging flow shares.

    Under credits a slow wire (a capped NIC, a slow PCIe write into the
    receiving GPU) holds posted slots, T-D, rather than G-T; in the fluid
    model T-D is the acknowledgement path. One GPU that most of the lag
    drains into, from several NICs, its NIC mates receiving normally: its
    PCIe. Every lagging flow through one NIC, from (or into) each of its
    GPUs that sends (receives) across hosts, while another NIC of the same
    host moves data to other hosts without lag: that NIC (the sending end
    first: T-D accrues on the wire it sends onto; a tie names both ends).
    Else the network path of the host most of them touch (one GPU's flows
    lagging while its NIC mate's do not are their route, not the NIC).
    """
    topo = ctx.topo
    if _drains_into_one_gpu(
        ctx, suspects, lag, Rule.PCIE_TD_LAG, "transmitted-not-done lag (T-D)"
    ):
        return
    nics = _weights(lag, topo.nic_key)
    tops = sorted(
        (k for k, (n, _, _) in nics.items() if n == len(lag)),
        key=lambda k: (-nics[k][1], -nics[k][2], str(k)),
    )
    named = [
        k
        for k in tops[:2]
        if _host_mate_clean(ctx, k, lag, flows)
        and _every_gpu_lags(ctx, k, lag, flows, sending=nics[k][1] > 0)
    ]
    for i, nic in enumerate(named):
        ends = [f.rank if topo.nic_key(f.rank) == nic else f.peer for f, _ in lag]
        _blame_flow(
            ctx,
            suspects,
            lag,
            flows,
            topo.ranks_on_nic(ends[0]),
            rule=Rule.NIC_TD_LAG,
            score=link_score(Rule.NIC_TD_LAG, len(lag)) * (AMBIGUOUS_END if i else 1.0),
            why=f"all {len(lag)} cross-host flows with a transmitted-not-done "
            f"lag (T-D) go through NIC {nic[1]} of {nic[0]}, "
            f"{nics[nic][1]} sent by it, while another NIC of {nic[0]} moves "
            "data normally: that NIC's link",
        )
    if named:
        return
    _blame_hosts(
        ctx,
        suspects,
        lag,
        flows,
        rule=Rule.LINK_TD_LAG,
        why=lambda host, n: (
            f"{n} of {len(lag)} cross-host flows with a "
            f"transmitted-not-done lag (T-D) touch host {host}: its network "
            "path acknowledges late"
        ),
    )


def _drains_into_one_gpu(
    ctx: DetectContext,
    suspects: dict[int, Suspect],
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
    suspects.setdefault(rx.rank, Suspect(rx.rank)).add(
        rule,
        f"{rx.flows} flows into rank {rx.rank} from {rx.senders} NICs hold "
        f"{rx.share:.0%} of the {gap} while its NIC mates receive normally: "
        "its receive path (PCIe) does not drain",
        score=link_score(rule, rx.flows),
    )
    return True


def _every_gpu_lags(
    ctx: DetectContext,
    nic: tuple[str, str],
    flags: list[LinkFlag],
    flows: list[FlowFeatures],
    *,
    sending: bool,
) -> bool:
    """Whether every GPU of ``nic`` that sends (``sending``, else receives)
    cross-host data in ``flows`` has a flagged flow that way: a NIC is shared
    by its GPUs, so one GPU's flows lagging while its NIC mate's do not is
    not the NIC."""
    topo = ctx.topo

    def end(f: FlowFeatures) -> int:
        return f.rank if sending else f.peer

    moving = {
        end(f)
        for f in flows
        if f.started
        and topo.host_of(f.rank) != topo.host_of(f.peer)
        and topo.nic_key(end(f)) == nic
    }
    lagging = {end(f) for f, _ in flags if topo.nic_key(end(f)) == nic}
    return bool(lagging) and moving <= lagging


def _host_mate_clean(
    ctx: DetectContext,
    nic: tuple[str, str],
    flags: list[LinkFlag],
    flows: list[FlowFeatures],
) -> bool:
    """Whether another NIC of ``nic``'s host carries a started cross-host
    flow (either end) that is not among ``flags``."""
    topo = ctx.topo
    flagged = {id(f) for f, _ in flags}
    for f in flows:
        if not f.started or id(f) in flagged:
            continue
        if topo.host_of(f.rank) == topo.host_of(f.peer):
            continue
        for end in (f.rank, f.peer):
            k = topo.nic_key(end)
            if k[0] == nic[0] and k != nic:
                return True
    return False


def _blame_hosts(
    ctx: DetectContext,
    suspects: dict[int, Suspect],
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
    hosts = _weights(flags, ctx.topo.host_of)
    most = max(n for n, _, _ in hosts.values())
    tops = sorted(
        (h for h, (n, _, _) in hosts.items() if n == most),
        key=lambda h: (-hosts[h][1], -hosts[h][2], h),
    )
    for i, host in enumerate(tops[:TIED_HOSTS]):
        _blame_flow(
            ctx,
            suspects,
            flags,
            flows,
            ctx.topo.ranks_on_host(host),
            rule=rule,
            score=link_score(rule, len(flags)) * (AMBIGUOUS_END if i else 1.0),
            why=why(host, most),
        )


def _one_gpu_behind(
    ctx: DetectContext,
    out_of: list[LinkFlag],
    backlog: list[LinkFlag],
    flows: list[FlowFeatures],
) -> int | None:
    """The one GPU whose sends back up while the other GPUs of its NIC send
    to other hosts without a backlog in the same window, else None.

    A NIC (its rate, its link) is shared by every GPU behind it; the send
    proxy is per GPU: a backlog on one GPU's sends only is its proxy.
    """
    ranks = {f.rank for f, _ in out_of}
    if len(ranks) != 1:
        return None
    rank = next(iter(ranks))
    mates = set(ctx.topo.ranks_on_nic(rank)) - {rank}
    flagged = {f.rank for f, _ in backlog}
    topo = ctx.topo
    clean = {
        f.rank
        for f in flows
        if f.rank in mates
        and f.started
        and f.rank not in flagged
        and topo.host_of(f.rank) != topo.host_of(f.peer)
    }
    return rank if mates and clean == mates else None


def _score_backlog(
    ctx: DetectContext,
    suspects: dict[int, Suspect],
    flows: list[FlowFeatures],
    backlog: list[LinkFlag],
) -> None:
    topo = ctx.topo
    if _drains_into_one_gpu(
        ctx, suspects, backlog, Rule.PCIE_BACKLOG, "ready-not-sent backlog (G-T)"
    ):
        return
    # NICs whose flows hold far more backlog than the other NICs' are where
    # it builds up; the small backlogs elsewhere wait on them (every flow of
    # a job stalls while one proxy or NIC holds its data back). The rules
    # below read their flows only: a congested switch still spreads them
    # over several NICs, one failing NIC or proxy does not.
    excess = {k: w for k, (_, _, w) in _weights(backlog, topo.nic_key).items()}
    lead = outliers(excess, ctx.cfg.gap_floor_chunks)
    if lead:
        backlog = [
            (f, ex)
            for f, ex in backlog
            if topo.nic_key(f.rank) in lead or topo.nic_key(f.peer) in lead
        ]
    nics = _weights(backlog, topo.nic_key)
    most = max(n for n, _, _ in nics.values())
    senders_all = {topo.nic_key(f.rank) for f, _ in backlog}
    if most < 0.5 * len(backlog) and len(senders_all) >= MAJORITY:
        _blame_hosts(
            ctx,
            suspects,
            backlog,
            flows,
            rule=Rule.SWITCH_BACKLOG,
            why=lambda host, n: (
                f"{len(backlog)} cross-host flows over {len(nics)} "
                f"NICs keep a ready-not-sent backlog (G-T), {n} touching host "
                f"{host}: congestion between hosts, not one NIC"
            ),
        )
        return
    tops = sorted(
        (k for k, (n, _, _) in nics.items() if n == most),
        key=lambda k: (-nics[k][1], -nics[k][2], str(k)),
    )
    tied = len(tops) > 1
    ends = _pair_ends(ctx, backlog, flows, tops) if tied else None
    for nic in tops[:2]:
        on = [
            (f, ex)
            for f, ex in backlog
            if nic in {topo.nic_key(f.rank), topo.nic_key(f.peer)}
        ]
        out_of = [(f, ex) for f, ex in on if topo.nic_key(f.rank) == nic]
        into = {f.peer for f, _ in on if topo.nic_key(f.rank) != nic}
        senders = {topo.nic_key(f.rank) for f, _ in on}
        if out_of:
            if ends is not None and not ends.send:
                continue
            alone = _one_gpu_behind(ctx, out_of, backlog, flows)
            rule = Rule.PROXY_SEND_BACKLOG if alone else Rule.NIC_SEND_BACKLOG
            _blame_flow(
                ctx,
                suspects,
                out_of,
                flows,
                topo.ranks_on_nic(out_of[0][0].rank),
                rule=rule,
                score=link_score(rule, most),
                why=f"{most} of {len(backlog)} cross-host flows with a "
                f"ready-not-sent backlog (G-T) go through NIC {nic[1]} of "
                f"{nic[0]}, {len(out_of)} sent by it"
                + (
                    f", all by rank {alone} while its NIC mate sends normally: "
                    "that GPU's send proxy"
                    if alone
                    else ""
                ),
            )
        elif len(into) == 1:
            if ends is not None and not ends.receive:
                continue
            rank = next(iter(into))
            # A pair's receiving end alone, its sender cleared, has no rival.
            sure = ends is not None and not ends.send
            share = 1.0 if sure or not (tied or len(senders) < PEERS) else AMBIGUOUS_END
            suspects.setdefault(rank, Suspect(rank)).add(
                Rule.NIC_PCIE_BACKLOG,
                f"{most} flows into rank {rank} from {len(senders)} NIC(s) keep "
                "a ready-not-sent backlog (G-T) while its NIC mate receives "
                "normally: its receive path (PCIe) does not drain",
                score=link_score(Rule.NIC_PCIE_BACKLOG, most) * share,
            )
        else:
            _blame_flow(
                ctx,
                suspects,
                on,
                flows,
                sorted(into),
                rule=Rule.NIC_RECEIVE_BACKLOG,
                score=link_score(Rule.NIC_RECEIVE_BACKLOG, most)
                * (AMBIGUOUS_END if tied else 1.0),
                why=f"{most} cross-host flows into both GPUs of NIC {nic[1]} "
                f"of {nic[0]} keep a ready-not-sent backlog (G-T): it does "
                "not take data in",
            )


class PairEnds(NamedTuple):
    """Which ends of a one-GPU-to-one-GPU backlog its flows leave possible."""

    send: bool
    receive: bool


def _pair_ends(
    ctx: DetectContext,
    backlog: list[LinkFlag],
    flows: list[FlowFeatures],
    tops: list[tuple[str, str]],
) -> PairEnds | None:
    """For a backlog on the tied NICs ``tops`` sent by one GPU to one GPU,
    the ends whose failure its flows can show; None for any other backlog.

    T standing still while data the receiver had posted buffers for waits
    is the transport stopping (a stalled proxy thread, a link down): a slow
    receive path drains steadily, so a stop leaves the sender only. A drain
    seen moving, never stopping, from a GPU whose NIC mate sends normally
    clears the shared NIC, and a send proxy holds data back only by not
    running (it posts what is staged whenever it runs): the receiver's path
    is left. Otherwise (no step seen yet) both.
    """
    topo = ctx.topo
    on = [
        (f, ex)
        for f, ex in backlog
        if {topo.nic_key(f.rank), topo.nic_key(f.peer)} & set(tops[:2])
    ]
    if len({(f.rank, f.peer) for f, _ in on}) != 1:
        return None
    if any(f.episodes or f.stall_steps for f, _ in on):
        return PairEnds(send=True, receive=False)
    if not any(f.drain_steps for f, _ in on):
        return PairEnds(send=True, receive=True)
    alone = _one_gpu_behind(ctx, on, backlog, flows)
    return PairEnds(send=alone is None, receive=True)
