"""``SLOW_TRANSFERS``: name the part that the transfers slowed on the wire share.

The model is ``transfer_times``'; this module reads the job's ring of wire
times and its topology and adds the verdict to the slowdown's suspects.
"""

from __future__ import annotations

import math

import numpy as np

from mycroft.schemas.vocab import Component
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.suspect import Suspects
from mycroft.streams.core.topology import JobTopology
from mycroft.streams.core.transfer_times import (
    PairChanges,
    Scope,
    Side,
    SlowPart,
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


def score_transfers(
    ctx: DetectContext, suspects: Suspects, since_ns: int
) -> list[SlowPart]:
    """Add ``SLOW_TRANSFERS`` for the parts that the transfers slowed on the
    wire since ``since_ns`` share; return them."""
    rca = ctx.cfg.rca
    rows = ctx.store.transfers.kept()
    if not len(rows):
        return []
    top = int(max(rows["rank"].max(), rows["peer"].max())) + 1
    nic_of, host_of = part_ids(ctx.topo, top)
    pairs = pair_changes(rows, since_ns, rca, nic_share(nic_of))
    if not pairs.slowed.any():
        return []
    parts = slow_parts(pairs, nic_of, host_of, rca)
    for part in parts:
        rank = part.ranks[0]
        score = rca.link_score(Rule.SLOW_TRANSFERS, part.slowed)
        suspects.at(rank).add(
            Rule.SLOW_TRANSFERS,
            _reason(part, pairs, nic_of, host_of),
            score=score,
            component=COMPONENT[part.scope],
        )
    return parts


def part_ids(topo: JobTopology, top: int) -> tuple[np.ndarray, np.ndarray]:
    """A job-wide NIC id and host id per rank below ``top`` (-1: unknown)."""
    nics: dict[tuple[str, str], int] = {}
    hosts: dict[str, int] = {}
    nic_of = np.full(top, -1, dtype=np.int64)
    host_of = np.full(top, -1, dtype=np.int64)
    for r in range(top):
        host, nic = topo.nic_key(r)
        if host:
            host_of[r] = hosts.setdefault(host, len(hosts))
            nic_of[r] = nics.setdefault((host, nic), len(nics))
    return nic_of, host_of


def _reason(
    part: SlowPart, pairs: PairChanges, nic_of: np.ndarray, host_of: np.ndarray
) -> str:
    ids = {Scope.NIC: nic_of, Scope.HOST: host_of}.get(part.scope)
    ends = pairs.rank if part.side == Side.SEND else pairs.peer
    mine = np.isin(ends, part.ranks) if ids is None else ids[ends] == part.key
    grew = math.exp(float(np.median(pairs.change[mine & pairs.slowed])))
    where = {
        Scope.RANK: "its path to its NIC",
        Scope.NIC: "its NIC",
        Scope.HOST: "its host",
    }
    verb = "sent" if part.side == Side.SEND else "received"
    return (
        f"{part.slowed} of {part.slowed + part.clean} transfers {verb} through "
        f"{where[part.scope]} (ranks {', '.join(map(str, part.ranks))}) spend "
        f"{grew:.1f}x their own time per chunk on the wire, beyond the job's change"
    )
