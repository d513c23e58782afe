"""The one receiver a ready-not-sent (G-T) backlog drains into, if any.

A G-T backlog on a cross-host flow means the sender has data it cannot
post: its NIC or the network does not take it, or the receiver has not
granted room for it (credit-based transports post a slot only when the
receiver freed one). Flows from several NICs that back up into the same
GPU share one part only, that GPU's receive path; a slow NIC or a congested
link backs up flows that share the NIC or the link instead, and a receiving
NIC at fault backs up flows into every GPU behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from mycroft.streams.core.flow_features import FlowFeatures
from mycroft.streams.core.topology import JobTopology

RECEIVER_SHARE = 0.5
"""Share of the backlog's summed excess one GPU must receive: more than
half, so at most one GPU qualifies and it explains most of the backlog."""

MIN_SENDER_NICS = 2
"""Distinct sending NICs the GPU's backlogged flows must come from: one
sender and one receiver are a pair whose ends counters cannot tell apart."""


class Receiver(NamedTuple):
    """A GPU that most of a backlog drains into."""

    rank: int
    share: float  # of the backlog's summed excess
    senders: int  # distinct sending NICs
    flows: int  # backlogged flows into it


def common_receiver(
    topo: JobTopology, backlog: Sequence[tuple[FlowFeatures, float]]
) -> Receiver | None:
    """Return the GPU receiving more than ``RECEIVER_SHARE`` of ``backlog``'s
    excess (``(flow, excess chunks)`` pairs) from ``MIN_SENDER_NICS`` or more
    NICs while no other GPU of its NIC receives a backlogged flow; else None.
    """
    total = sum(ex for _, ex in backlog)
    if total <= 0:
        return None
    into: dict[int, float] = {}
    for f, ex in backlog:
        into[f.peer] = into.get(f.peer, 0.0) + ex
    rank, excess = max(into.items(), key=lambda kv: (kv[1], -kv[0]))
    if excess <= RECEIVER_SHARE * total:
        return None
    mates = set(topo.ranks_on_nic(rank)) - {rank}
    if mates & into.keys():
        return None
    mine = [f for f, _ in backlog if f.peer == rank]
    senders = {topo.nic_key(f.rank) for f in mine}
    if len(senders) < MIN_SENDER_NICS:
        return None
    return Receiver(rank, excess / total, len(senders), len(mine))
