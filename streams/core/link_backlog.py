"""G-T (ready, not sent) backlog of a slowdown's cross-host flows, on the
part the flagged flows share.

| flagged flows                                                  | component |
|----------------------------------------------------------------|-----------|
| G-T only on flows into one GPU, from >= 2 NICs                 | pcie      |
| G-T spread over >= 3 NICs, none on half                        | network   |
| G-T on flows through one NIC, some sent by it                  | nic       |
| ... its flows' T froze in 1-2 long (>= 0.3 s) episodes         | proxy     |
| ... all sent by one GPU, its NIC mate sending normally (*)     | proxy     |
| G-T from one GPU to one GPU: T seen stopping                   | (sender)  |
| ... T seen draining, never stopping, sender's NIC mate clean (*) | pcie (rx) |

(*) sending to other hosts with no backlog flagged and no send the wire
timing saw slowed. Between the last two rows: the pair slowed on the wire
while one of its ends moves its other transfers as before clears that end
(``PairChanges.cleared_ends``). ``streams/core/README.md`` (slowdown)
explains each row.
"""

from __future__ import annotations

from typing import NamedTuple

from mycroft.streams.core.baseline import outliers
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.flow_features import FlowFeatures
from mycroft.streams.core.link_blame import (
    LinkFlag,
    blame_flow,
    blame_hosts,
    drains_into_one_gpu,
    weights,
)
from mycroft.streams.core.scoring import MAJORITY, PEERS
from mycroft.streams.core.suspect import Suspects
from mycroft.streams.core.transfer_times import NO_PAIRS, PairChanges

BACKLOG = "ready-not-sent backlog (G-T, or the time its head step waited ready)"
"""How the evidence names it: a producer whose send G is at most T + 1 (the
NCCL plugin) shows the backlog as the time its head step waited ready
(``progress.held_ready``)."""


def _one_gpu_behind(
    ctx: DetectContext,
    out_of: list[LinkFlag],
    backlog: list[LinkFlag],
    flows: list[FlowFeatures],
    wire: PairChanges,
) -> int | None:
    """The one GPU whose sends back up while the other GPUs of its NIC send
    to other hosts without a backlog in the same window, else None.

    A NIC (its rate, its link) is shared by every GPU behind it; the send
    proxy is per GPU: a backlog on one GPU's sends only is its proxy. A mate
    whose sends the wire timing saw slowed (``wire``) is not sending
    normally, even with no backlog flagged: a capped NIC slows every GPU's
    sends through it, and its flows' gaps need not leave their band.
    """
    ranks = {f.rank for f, _ in out_of}
    if len(ranks) != 1:
        return None
    rank = next(iter(ranks))
    mates = set(ctx.topo.ranks_on_nic(rank)) - {rank}
    flagged = {f.rank for f, _ in backlog} | wire.slowed_senders
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


def score_backlog(
    ctx: DetectContext,
    suspects: Suspects,
    flows: list[FlowFeatures],
    backlog: list[LinkFlag],
    wire: PairChanges = NO_PAIRS,
) -> None:
    """Name the part the G-T backlog's flows share (module table); ``wire``:
    the cross-host pairs the wire timing measured since the onset."""
    topo, rca = ctx.topo, suspects.rca
    if drains_into_one_gpu(ctx, suspects, backlog, Rule.PCIE_BACKLOG, BACKLOG):
        return
    # NICs whose flows hold far more backlog than the other NICs' are where
    # it builds up; the small backlogs elsewhere wait on them (every flow of
    # a job stalls while one proxy or NIC holds its data back). The rules
    # below read their flows only: a congested switch still spreads them
    # over several NICs, one failing NIC or proxy does not.
    excess = {k: w for k, (_, _, w) in weights(backlog, topo.nic_key).items()}
    lead = outliers(excess, ctx.cfg.gap_floor_chunks)
    if lead:
        backlog = [
            (f, ex)
            for f, ex in backlog
            if topo.nic_key(f.rank) in lead or topo.nic_key(f.peer) in lead
        ]
    nics = weights(backlog, topo.nic_key)
    most = max(n for n, _, _ in nics.values())
    senders_all = {topo.nic_key(f.rank) for f, _ in backlog}
    if most < 0.5 * len(backlog) and len(senders_all) >= MAJORITY:
        blame_hosts(
            ctx,
            suspects,
            backlog,
            flows,
            rule=Rule.SWITCH_BACKLOG,
            why=lambda host, n: (
                f"{len(backlog)} cross-host flows over {len(nics)} "
                f"NICs keep a {BACKLOG}, {n} touching host "
                f"{host}: congestion between hosts, not one NIC"
            ),
        )
        return
    tops = sorted(
        (k for k, (n, _, _) in nics.items() if n == most),
        key=lambda k: (-nics[k][1], -nics[k][2], str(k)),
    )
    tied = len(tops) > 1
    ends = _pair_ends(ctx, backlog, flows, tops, wire) if tied else None
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
            alone = _one_gpu_behind(ctx, out_of, backlog, flows, wire)
            rule = Rule.PROXY_SEND_BACKLOG if alone else Rule.NIC_SEND_BACKLOG
            blame_flow(
                ctx,
                suspects,
                out_of,
                flows,
                topo.ranks_on_nic(out_of[0][0].rank),
                rule=rule,
                score=rca.link_score(rule, most),
                why=f"{most} of {len(backlog)} cross-host flows with a "
                f"{BACKLOG} go through NIC {nic[1]} of "
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
            share = (
                1.0 if sure or not (tied or len(senders) < PEERS) else rca.ambiguous_end
            )
            suspects.at(rank).add(
                Rule.NIC_PCIE_BACKLOG,
                f"{most} flows into rank {rank} from {len(senders)} NIC(s) keep "
                f"a {BACKLOG}, no other GPU of its NIC "
                "receiving one: its receive path (PCIe) does not drain",
                score=rca.link_score(Rule.NIC_PCIE_BACKLOG, most) * share,
            )
        else:
            blame_flow(
                ctx,
                suspects,
                on,
                flows,
                sorted(into),
                rule=Rule.NIC_RECEIVE_BACKLOG,
                score=rca.link_score(Rule.NIC_RECEIVE_BACKLOG, most)
                * (rca.ambiguous_end if tied else 1.0),
                why=f"{most} cross-host flows into both GPUs of NIC {nic[1]} "
                f"of {nic[0]} keep a {BACKLOG}: it does "
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
    wire: PairChanges,
) -> PairEnds | None:
    """For a backlog on the tied NICs ``tops`` sent by one GPU to one GPU,
    the ends whose failure its flows can show; None for any other backlog.

    T standing still while data the receiver had posted buffers for waits
    is the transport stopping (a stalled proxy thread, a link down): a slow
    receive path drains steadily, so a stop leaves the sender only. A drain
    seen moving, never stopping, from a GPU whose NIC mate sends normally
    clears the shared NIC, and a send proxy holds data back only by not
    running (it posts what is staged whenever it runs): the receiver's path
    is left. Before the drain is read, the pair slowed on the wire while one
    end moves its other transfers as before leaves the other end (the wire
    times each part; a stop is read first because a sender's proxy that
    stops also observes its in-flight sends done late, which stretches their
    wire time). Otherwise (no step seen yet) both.
    """
    topo = ctx.topo
    on = [
        (f, ex)
        for f, ex in backlog
        if {topo.nic_key(f.rank), topo.nic_key(f.peer)} & set(tops[:2])
    ]
    pairs = {(f.rank, f.peer) for f, _ in on}
    if len(pairs) != 1:
        return None
    if any(f.stopped for f, _ in on):
        return PairEnds(send=True, receive=False)
    sender, receiver = wire.cleared_ends(
        *next(iter(pairs)), ctx.cfg.rca.transfer_slow_ratio
    )
    if sender != receiver:
        return PairEnds(send=not sender, receive=not receiver)
    if not any(f.drain_steps for f, _ in on):
        return PairEnds(send=True, receive=True)
    alone = _one_gpu_behind(ctx, on, backlog, flows, wire)
    return PairEnds(send=alone is None, receive=True)
