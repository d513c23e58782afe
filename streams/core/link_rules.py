"""Link evidence of a slowdown: G/T/D gaps of cross-host flows, attributed
to the part the flagged flows share.

| flagged flows                                                  | component |
|----------------------------------------------------------------|-----------|
| T-D (sent, not acked) mostly into one GPU, from >= 2 NICs      | pcie      |
| T-D on every GPU's flows through one NIC, another NIC of its   | nic       |
| host moving data normally                                      |           |
| T-D otherwise: the host most of them touch                     | network   |
| G-T (ready, not sent): ``link_backlog``'s table                | ...       |

Gaps are judged in chunks against the role's pooled healthy baseline
(learned by the ``slow_td`` detector); each flagged flow counts at both
ends. How a verdict names a rank and its flow: ``link_blame``.
``streams/core/README.md`` (slowdown) explains each row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import binom

from mycroft.streams.core.baseline import outliers
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.detect_slow import gap_floor, role_gap_baseline
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.flow_features import FlowFeatures
from mycroft.streams.core.link_backlog import score_backlog
from mycroft.streams.core.link_blame import (
    LinkFlag,
    blame_flow,
    blame_hosts,
    drains_into_one_gpu,
    weights,
)
from mycroft.streams.core.suspect import Suspects
from mycroft.streams.core.transfer_times import NO_PAIRS, PairChanges


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


def score_links(
    ctx: DetectContext,
    suspects: Suspects,
    flows: list[FlowFeatures],
    wire: PairChanges = NO_PAIRS,
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

    ``wire``: the cross-host pairs the wire timing measured since the onset
    (``rca_transfers.WireView.pairs``). A rank with a send slowed on it does
    not send normally, whatever its flows' gaps, so it never clears its NIC
    mate's NIC; an end of a one-GPU-to-one-GPU backlog that moves its other
    transfers as before is cleared (``PairChanges.cleared_ends``).
    """
    lag = _flag_gaps(ctx, flows, "td")
    if lag:
        _score_lag(ctx, suspects, flows, lag)
    # G-T here is the part the receiver had posted buffers for: a backlog
    # waiting on the receiver's credit is the receiver's, which its timing
    # shows (``FlowFeatures.wait_chunks``).
    backlog = _flag_gaps(ctx, flows, "gt")
    if backlog:
        score_backlog(ctx, suspects, flows, backlog, wire)


def _score_lag(
    ctx: DetectContext,
    suspects: Suspects,
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
    first: T-D accrues on the wire it sends onto; a tie names both ends, and
    a sending NIC whose lag all drains into one GPU ties with that GPU's
    PCIe: ``_receiver_tied``).
    Else the network path of the host most of them touch (one GPU's flows
    lagging while its NIC mate's do not are their route, not the NIC).
    """
    topo = ctx.topo
    if drains_into_one_gpu(
        ctx, suspects, lag, Rule.PCIE_TD_LAG, "transmitted-not-done lag (T-D)"
    ):
        return
    nics = weights(lag, topo.nic_key)
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
    rca = suspects.rca
    for i, nic in enumerate(named):
        ends = [f.rank if topo.nic_key(f.rank) == nic else f.peer for f, _ in lag]
        blame_flow(
            ctx,
            suspects,
            lag,
            flows,
            topo.ranks_on_nic(ends[0]),
            rule=Rule.NIC_TD_LAG,
            score=rca.link_score(Rule.NIC_TD_LAG, len(lag))
            * (rca.ambiguous_end if i else 1.0),
            why=f"all {len(lag)} cross-host flows with a transmitted-not-done "
            f"lag (T-D) go through NIC {nic[1]} of {nic[0]}, "
            f"{nics[nic][1]} sent by it, while another NIC of {nic[0]} moves "
            "data normally: that NIC's link",
        )
    if named:
        _receiver_tied(ctx, suspects, lag, named, sent=nics[named[0]][1])
        return
    blame_hosts(
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


def _receiver_tied(
    ctx: DetectContext,
    suspects: Suspects,
    lag: list[LinkFlag],
    named: list[tuple[str, str]],
    *,
    sent: int,
) -> None:
    """Name the one GPU every lagging flow drains into (its receive path,
    PCIe), as the weaker end, when only the NIC sending them all was named.

    A slow PCIe write into the receiving GPU holds the sender's posted slots
    just as a slow transmit does: one NIC's flows into one GPU cannot tell
    the two apart (``drains_into_one_gpu`` needs several sending NICs), and
    the tie keeps the answer revisable until the wire timing measures the
    parts.
    """
    topo = ctx.topo
    into = {f.peer for f, _ in lag}
    if len(named) != 1 or sent != len(lag) or len(into) != 1:
        return
    (rx,) = into
    if topo.nic_key(rx) in named:
        return
    rca = suspects.rca
    suspects.at(rx).add(
        Rule.PCIE_TD_LAG,
        f"all {len(lag)} cross-host flows with a transmitted-not-done lag (T-D) "
        f"drain into rank {rx}, all from NIC {named[0][1]} of {named[0][0]}: "
        "its receive path (PCIe) reads alike",
        score=rca.link_score(Rule.PCIE_TD_LAG, len(lag)) * rca.ambiguous_end,
        flow=(lag[0][0].rank, lag[0][0].channel),
    )


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
