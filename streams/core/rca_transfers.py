"""``SLOW_TRANSFERS``: name the part that the transfers slowed on the wire share.

The model is ``transfer_times``'; this module reads the job's ring of wire
times and its topology (:func:`wire_view`, once per slowdown refresh) and
adds the verdict to the slowdown's suspects. The same view tells the flow
rules which ranks' sends the wire timing saw slowed, and whether it has
measured anything since the onset yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from mycroft.schemas.vocab import Component
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.suspect import Suspects
from mycroft.streams.core.transfer_times import (
    NO_PAIRS,
    PairChanges,
    Scope,
    Side,
    SlowPart,
    alarm_parts,
    nic_share,
    pair_changes,
    slow_parts,
)

COMPONENT = {
    Scope.RANK: Component.PCIE,
    Scope.NIC: Component.NIC,
    Scope.HOST: Component.NETWORK,
}
"""What a slowed part is: a rank's own path to its NIC is its PCIe link; a
host's whole traffic shares its uplink and the network beyond it."""


@dataclass(frozen=True)
class WireView:
    """What the job's wire timing says since a slowdown's onset.

    ``pending``: transfers were timed before the onset and no pair has been
    timed on both sides of it yet (``transfer_min_after`` sends after it):
    the direct measurement of every part is still to come.
    """

    pairs: PairChanges  # between two hosts (:meth:`PairChanges.across`)
    nic_of: np.ndarray
    host_of: np.ndarray
    pending: bool
    unmargined: Callable[[], PairChanges] = field(
        default=lambda: NO_PAIRS, repr=False, compare=False
    )

    @cached_property
    def raw(self) -> PairChanges:
        """The same pairs without the NIC-share margin; computed when first
        read (only the uplink reading, :func:`score_uplinks`, reads it)."""
        return self.unmargined().across(self.host_of)


def wire_view(ctx: DetectContext, since_ns: int) -> WireView | None:
    """The job's wire timing around ``since_ns``; None when its producers do
    not time the wire (no timed transfer held)."""
    times = ctx.store.transfers
    rows = times.kept()
    if not len(rows):
        return None
    top = int(max(rows["rank"].max(), rows["peer"].max())) + 1
    nic_of, host_of = ctx.topo.part_ids(top)
    before = times.before(since_ns)
    pairs = pair_changes(rows, since_ns, ctx.cfg.rca, nic_share(nic_of), before)
    pending = bool(len(before.key)) and not len(pairs.rank)
    return WireView(
        pairs.across(host_of),
        nic_of,
        host_of,
        pending,
        lambda: pair_changes(rows, since_ns, ctx.cfg.rca, None, before),
    )


def score_transfers(
    suspects: Suspects,
    wire: WireView | None,
    stopped: Callable[[], frozenset[int]] = frozenset,
) -> list[SlowPart]:
    """Add ``SLOW_TRANSFERS`` for the parts that the transfers slowed on the
    wire share (``wire``: :func:`wire_view`; ``stopped``: the ranks whose
    sends were seen standing still, :func:`transfer_times.slow_parts`);
    return them."""
    if wire is None or not wire.pairs.slowed.any():
        return []
    rca = suspects.rca
    parts = slow_parts(wire.pairs, wire.nic_of, wire.host_of, rca, stopped)
    _add(suspects, parts, wire.pairs, wire)
    return parts


def score_uplinks(
    suspects: Suspects,
    wire: WireView | None,
    alarm_llr: float,
    named: list[SlowPart],
) -> list[SlowPart]:
    """Add ``SLOW_TRANSFERS`` for the parts the wire check alarms on
    (``detect_wire``: two or more pairs slowed without the NIC-share margin,
    log-likelihood ratio ``alarm_llr`` or more) that :func:`score_transfers`
    did not name (``named``); return them.

    The margin covers a fault elsewhere moving NIC mates' sends together,
    a few pairs stretched up to k-fold; traffic on a host's uplink
    stretches all of its pairs, often by less than k. A GPU that computes
    slowly also copies slowly, and stretches its transfers within the margin
    too: call this only when no rank is late.
    """
    if wire is None or not wire.raw.slowed.any():
        return []
    seen = {(p.scope, p.key) for p in named}
    alarmed = alarm_parts(wire.raw, wire.nic_of, wire.host_of, suspects.rca, alarm_llr)
    parts = [p for p in alarmed if (p.scope, p.key) not in seen]
    _add(suspects, parts, wire.raw, wire)
    return parts


def _add(
    suspects: Suspects, parts: list[SlowPart], pairs: PairChanges, wire: WireView
) -> None:
    for part in parts:
        suspects.at(part.ranks[0]).add(
            Rule.SLOW_TRANSFERS,
            _reason(part, pairs, wire.nic_of, wire.host_of),
            score=suspects.rca.link_score(Rule.SLOW_TRANSFERS, part.slowed),
            component=COMPONENT[part.scope],
        )


def _reason(
    part: SlowPart, pairs: PairChanges, nic_of: np.ndarray, host_of: np.ndarray
) -> str:
    ids = {Scope.NIC: nic_of, Scope.HOST: host_of}.get(part.scope)
    sides = {Side.SEND: (pairs.rank,), Side.RECV: (pairs.peer,)}
    mine = np.zeros(len(pairs.rank), dtype=bool)
    for ends in sides.get(part.side, (pairs.rank, pairs.peer)):
        mine |= np.isin(ends, part.ranks) if ids is None else ids[ends] == part.key
    grew = math.exp(float(np.median(pairs.change[mine & pairs.slowed])))
    where = {
        Scope.RANK: "its path to its NIC",
        Scope.NIC: "its NIC",
        Scope.HOST: "its host",
    }
    verb = {Side.SEND: "sent", Side.RECV: "received"}.get(part.side, "sent or received")
    return (
        f"{part.slowed} of {part.slowed + part.clean} transfers {verb} through "
        f"{where[part.scope]} (ranks {', '.join(map(str, part.ranks))}) spend "
        f"{grew:.1f}x their own time per chunk on the wire, beyond the job's change"
    )
