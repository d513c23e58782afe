"""Job topology assembled from the per-host Topology records."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mycroft.schemas.records import ChannelTopology, Connection, Topology

_ROLES = ("tp", "pp", "dp", "ep", "cp", "sp", "world")


def role_of(name: str) -> str:
    """Return the parallelism role of a communicator name (``tp``, ``pp``, ...).

    Args:
        name: The communicator's name as the tracer reported it.

    Returns:
        The first known role token found in the name, else ``"other"``.
    """
    low = name.lower()
    for role in _ROLES:
        if low.startswith(role) or f"_{role}" in low or f"-{role}" in low:
            return role
    return "other"


@dataclass
class CommInfo:
    """One communicator: its ordered members and per-rank ring/tree neighbours."""

    comm: int
    name: str
    role: str
    ranks: tuple[int, ...]
    channels: dict[int, tuple[ChannelTopology, ...]] = field(default_factory=dict)
    connections: dict[int, tuple[Connection, ...]] = field(default_factory=dict)

    def upstream(self, rank: int) -> set[tuple[int, int]]:
        """Return ``(peer, channel)`` pairs ``rank`` receives data from.

        Ring previous, tree parent and children, plus every ``recv`` connection.
        """
        out: set[tuple[int, int]] = set()
        for ch in self.channels.get(rank, ()):
            for peer in (ch.ring_prev, ch.tree_parent, *ch.tree_children):
                if peer >= 0 and peer != rank:
                    out.add((peer, ch.channel))
        for conn in self.connections.get(rank, ()):
            if conn.direction == "recv":
                out.add((conn.peer, conn.channel))
        return out


@dataclass
class JobTopology:
    """Where every rank runs and which communicators join them.

    Built incrementally: ``add`` merges one host's Topology record; a later
    record of the same host replaces what that host said before. Change it
    through ``add`` only.
    """

    job_id: str = ""
    rank_host: dict[int, str] = field(default_factory=dict)
    rank_nic: dict[int, str] = field(default_factory=dict)
    rank_gpu: dict[int, str] = field(default_factory=dict)
    comms: dict[int, CommInfo] = field(default_factory=dict)

    def snapshot_state(self) -> dict[str, object]:
        """Snapshot state (worker snapshots): the maps, without caches."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def restore_state(self, state: dict[str, object]) -> None:
        """Restore from :meth:`snapshot_state`."""
        self.__dict__.update(state)

    def add(self, topo: Topology) -> None:
        """Merge one host's topology record."""
        self.__dict__["_added"] = self.__dict__.get("_added", 0) + 1
        self.job_id = topo.job_id
        for rt in topo.ranks:
            self.rank_host[rt.rank] = topo.host
            self.rank_nic[rt.rank] = rt.nic
            self.rank_gpu[rt.rank] = rt.gpu
            for m in rt.comms:
                info = self.comms.get(m.comm)
                if info is None:
                    info = CommInfo(m.comm, m.name, role_of(m.name), tuple(m.ranks))
                    self.comms[m.comm] = info
                info.channels[rt.rank] = m.channels
                info.connections[rt.rank] = m.connections

    def comm_sizes(self) -> dict[int, int]:
        """Members per communicator (cached: comms are only ever added, and a
        comm's members are fixed when it is first seen)."""
        cached = self.__dict__.get("_sizes")
        if not isinstance(cached, dict) or len(cached) != len(self.comms):
            cached = {c: len(info.ranks) for c, info in self.comms.items()}
            self.__dict__["_sizes"] = cached
        return cached

    def part_ids(self, top: int) -> tuple[np.ndarray, np.ndarray]:
        """A job-wide NIC id and host id per rank below ``top`` (-1: unknown),
        read-only; cached until ``add`` changes the topology."""
        key = (self.__dict__.get("_added", 0), top)
        cached = self.__dict__.get("_parts")
        if cached is not None and cached[0] == key:
            ids: tuple[np.ndarray, np.ndarray] = cached[1]
            return ids
        nics: dict[tuple[str, str], int] = {}
        hosts: dict[str, int] = {}
        nic_of = np.full(top, -1, dtype=np.int64)
        host_of = np.full(top, -1, dtype=np.int64)
        for r in range(top):
            host, nic = self.nic_key(r)
            if host:
                host_of[r] = hosts.setdefault(host, len(hosts))
                nic_of[r] = nics.setdefault((host, nic), len(nics))
        nic_of.setflags(write=False)
        host_of.setflags(write=False)
        self.__dict__["_parts"] = (key, (nic_of, host_of))
        return nic_of, host_of

    def members(self, comm: int) -> tuple[int, ...]:
        """Return the global ranks of ``comm`` in communicator order (may be ())."""
        info = self.comms.get(comm)
        return info.ranks if info else ()

    def host_of(self, rank: int) -> str:
        """Return the host of ``rank``, or ``""`` when unknown."""
        return self.rank_host.get(rank, "")

    def nic_key(self, rank: int) -> tuple[str, str]:
        """Return ``(host, nic)`` of ``rank``: the identity of its NIC job-wide."""
        return self.rank_host.get(rank, ""), self.rank_nic.get(rank, "")

    def ranks_on_host(self, host: str) -> list[int]:
        """Return the ranks of ``host``, sorted."""
        return sorted(r for r, h in self.rank_host.items() if h == host)

    def ranks_on_nic(self, rank: int) -> list[int]:
        """Return every rank sharing ``rank``'s NIC, sorted (``rank`` included)."""
        key = self.nic_key(rank)
        return sorted(r for r in self.rank_host if self.nic_key(r) == key)

    def comms_of(self, rank: int) -> list[int]:
        """Return the communicators ``rank`` belongs to."""
        return [c for c, info in self.comms.items() if rank in info.ranks]
