"""Topology records: where each rank runs and its communicators' rings."""

from __future__ import annotations

import numpy as np

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.layout import (
    CommGroup,
    Layout,
    host_ip,
    host_name,
    nic_name,
)
from mycroft.producers.sim.tree import double_tree, tree_count
from mycroft.schemas.records import (
    ChannelTopology,
    CommMembership,
    Connection,
    RankTopology,
    Topology,
)


def _channels(cfg: SimConfig, role: str) -> int:
    hw = cfg.hardware
    return {"tp": hw.tp_channels, "dp": hw.dp_channels}.get(role, hw.pp_channels)


def _membership(
    cfg: SimConfig, layout: Layout, group: CommGroup, g: int, i: int
) -> CommMembership:
    members = group.ranks[g]
    n = len(members)
    prev, nxt = int(members[(i - 1) % n]), int(members[(i + 1) % n])
    me = int(members[i])
    channels = range(_channels(cfg, group.role))
    host = layout.host_of
    conns: list[Connection] = []
    tree = _tree(cfg, group.role, n)
    chans: list[ChannelTopology] = []
    for c in channels:
        peers: tuple[tuple[int, str], ...] = ((nxt, "send"), (prev, "recv"))
        parent, kids = -1, tuple[int, ...]()
        if tree:
            # The comm's only collective is the tree all-reduce: its
            # connections are the tree's (one each way per neighbour).
            pos = tree[c % len(tree)]
            parent = int(members[pos[i]]) if pos[i] >= 0 else -1
            kids = tuple(int(members[k]) for k, p in enumerate(pos) if p == i)
            nbrs = ((parent,) if parent >= 0 else ()) + kids
            peers = tuple((r, d) for r in nbrs for d in ("send", "recv"))
        chans.append(ChannelTopology(c, prev, nxt, parent, kids))
        for peer, direction in peers:
            transport = "p2p" if host[peer] == host[me] else "net"
            conns.append(Connection(peer, c, direction, transport))
    return CommMembership(
        comm=int(group.comm[g]),
        name=group.role,
        nranks=n,
        comm_rank=i,
        ranks=tuple(int(r) for r in members),
        channels=tuple(chans),
        connections=tuple(conns),
    )


def _tree(cfg: SimConfig, role: str, n: int) -> list[list[int]]:
    """Parents per tree of a comm that runs tree all-reduces only (else [])."""
    tree_roles = ("tp", "dp") if cfg.workload.dp_allreduce else ("tp",)
    if cfg.hardware.allreduce != "tree" or role not in tree_roles:
        return []
    return list(double_tree(n)[: tree_count(_channels(cfg, role), n)])


def _memberships(cfg: SimConfig, layout: Layout) -> dict[int, list[CommMembership]]:
    out: dict[int, list[CommMembership]] = {r: [] for r in range(layout.nranks)}
    for group in layout.groups():
        for g, members in enumerate(group.ranks):
            for i, rank in enumerate(members):
                out[int(rank)].append(_membership(cfg, layout, group, g, i))
    return out


def topologies(cfg: SimConfig, layout: Layout, offsets_s: np.ndarray) -> list[Topology]:
    """One Topology per host, taken at the trace start on the host's clock."""
    comms = _memberships(cfg, layout)
    gpn = cfg.hardware.gpus_per_nic
    out = []
    for h in range(layout.nhosts):
        ranks = tuple(
            RankTopology(
                rank=int(r),
                local_rank=int(layout.local_of[r]),
                gpu=f"0000:{0x18 + 0x10 * int(layout.local_of[r]):02x}:00.0",
                nic=nic_name(int(layout.local_of[r]) // gpn),
                comms=tuple(comms[int(r)]),
            )
            for r in layout.host_ranks(h)
        )
        ts_ns = cfg.start_ns + round(float(offsets_s[h]) * 1e9)
        out.append(Topology(cfg.job_id, host_name(h), host_ip(h), ts_ns, ranks))
    return out
