"""The topology side of the input contract: which host runs which rank, and
which (rank, comm) pairs exist, as lookups the row checks run columnar."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mycroft.schemas.records import CommMembership, Topology
from mycroft.schemas.text import comm_hex
from mycroft.streams.core import row_checks as rows
from mycroft.streams.core.contract import Contract, Reason
from mycroft.streams.core.membership import (
    UNKNOWN,
    MembershipJoin,
    is_partial,
    resolved,
)

MAX_WORLD = 1 << 20
"""Largest rank number a topology may declare (a million ranks)."""


@dataclass
class TopologyView:
    """What the job's valid topology records declared so far."""

    hosts: dict[str, np.ndarray] = field(default_factory=dict)  # host -> its ranks
    host_ids: dict[str, int] = field(default_factory=dict)
    comms: dict[int, tuple[int, ...]] = field(default_factory=dict)  # comm -> members
    rank_host: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    member_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    version: int = 0  # + 1 on every change
    # Every (member, comm) pair declared, as columns.
    pair_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_comm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    # Per host: (version, sorted pair keys of its ranks in each of their comms).
    _own: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)
    # Comms declared in part by some host, until every position is known.
    join: MembershipJoin = field(default_factory=MembershipJoin)

    @property
    def world(self) -> int:
        """One past the highest rank any record declared (0: none)."""
        return len(self.rank_host)

    def conflict(self, topo: Topology) -> str:
        """Why ``topo``'s members contradict earlier declarations, or ``""``."""
        return self.join.conflict(topo, self.comms)

    def add(self, topo: Topology) -> list[Topology]:
        """Take one host's (valid, not conflicting) topology: it replaces what
        the host said. Returns the records to pass on: ``topo`` with its
        partial declarations resolved (``membership.resolved``), after the
        earlier records of other hosts whose comms ``topo`` completed."""
        self.version += 1
        hid = self.host_ids.setdefault(topo.host, len(self.host_ids))
        ranks = np.array([rt.rank for rt in topo.ranks], dtype=np.int64)
        new_comms = False
        for rt in topo.ranks:
            for m in rt.comms:
                if m.comm not in self.comms and not is_partial(m):
                    self.comms[m.comm] = tuple(m.ranks)
                    new_comms = True
        completed = self.join.declare(topo, self.comms)
        new_comms = new_comms or bool(completed)
        top = max([int(ranks.max()) if len(ranks) else -1] + self._highest(topo))
        if top >= self.world:
            grown = np.full(top + 1, -1, dtype=np.int32)
            grown[: self.world] = self.rank_host
            self.rank_host = grown
        self.rank_host[self.rank_host == hid] = -1
        self.rank_host[ranks] = hid
        self.hosts[topo.host] = ranks
        if new_comms:
            self._rebuild_members()
        again = self.join.waiting_on(completed, topo.host)
        return [resolved(t, self.comms) for t in [*again, topo]]

    def relative(self, host: str) -> frozenset[int] | None:
        """Comms ``host`` declared in part: its flow peers there are positions
        (``None``: the host declared nothing yet)."""
        return self.join.relative.get(host)

    def global_peers(
        self, comm: np.ndarray, peer: np.ndarray, relative: frozenset[int]
    ) -> np.ndarray | None:
        """Flow ``peer`` s with positions in the complete comms of ``relative``
        mapped to global ranks (a position outside the comm: ``-1``), or
        ``None`` when no row is of such a comm."""
        out: np.ndarray | None = None
        for c in sorted(relative):
            members = self.comms.get(c)
            rows_c = comm == np.uint64(c & 0xFFFF_FFFF_FFFF_FFFF)
            if members is None or not rows_c.any():
                continue
            out = peer.copy() if out is None else out
            table = np.asarray(members, dtype=np.int64)
            pos = peer[rows_c].astype(np.int64)
            inside = (pos >= 0) & (pos < len(table))
            mapped = np.full(len(pos), UNKNOWN, dtype=np.int64)
            mapped[inside] = table[pos[inside]]
            out[rows_c] = mapped
        return out

    def drop_host(self, host: str) -> None:
        """Forget the ranks of ``host`` (it left the job)."""
        self.version += 1
        hid = self.host_ids.get(host)
        if hid is not None:
            self.rank_host[self.rank_host == hid] = -1
        self.hosts.pop(host, None)
        self.join.forget(host)

    def place(
        self, rank: np.ndarray, comm: np.ndarray, host: str, codes: np.ndarray
    ) -> np.ndarray:
        """Mark rows of ranks another host runs; return the rows to hold:
        valid so far, but the rank's host or its (rank, comm) not declared."""
        elsewhere, unplaced = self.locate(rank, comm, host)
        rows.mark(codes, elsewhere, Reason.RANK_NOT_ON_HOST)
        return np.asarray((codes == 0) & unplaced)

    def locate(
        self, rank: np.ndarray, comm: np.ndarray, host: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ranks another host runs, and rows whose rank's host or
        (rank, comm) is not declared (a function of ``version`` and the rows)."""
        hid = self.host_ids.get(host, -2)
        r = rank.astype(np.int64)
        inside = (r >= 0) & (r < self.world)
        owner = np.full(len(r), -1, dtype=np.int64)
        owner[inside] = self.rank_host[r[inside]]
        elsewhere = (owner >= 0) & (owner != hid)
        return elsewhere, (owner < 0) | ~self.members(rank, comm)

    def all_placed(self, rank: np.ndarray, comm: np.ndarray, host: str) -> bool:
        """Whether every row's rank runs on ``host`` and is a member of its
        ``comm``: then ``locate`` marks nothing (one lookup instead of its
        per-row form)."""
        if not len(rank):
            return True
        own = self._own.get(host)
        if own is None or own[0] != self.version:
            own = (self.version, self._own_keys(host))
            self._own[host] = own
        return bool(rows.isin_sorted(rows.pair_keys(rank, comm), own[1]).all())

    def members(self, rank: np.ndarray, comm: np.ndarray) -> np.ndarray:
        """Whether each ``rank`` is a member of its row's ``comm``."""
        return rows.isin_sorted(rows.pair_keys(rank, comm), self.member_keys)

    def _own_keys(self, host: str) -> np.ndarray:
        hid = self.host_ids.get(host)
        if hid is None or not len(self.pair_rank):
            return np.zeros(0, np.uint64)
        mine = self.rank_host[self.pair_rank] == hid
        return np.unique(rows.pair_keys(self.pair_rank[mine], self.pair_comm[mine]))

    def _highest(self, topo: Topology) -> list[int]:
        return [max(m.ranks, default=-1) for rt in topo.ranks for m in rt.comms]

    def _rebuild_members(self) -> None:
        sizes = [len(m) for m in self.comms.values()]
        member = np.concatenate(
            [np.asarray(m, dtype=np.int64) for m in self.comms.values()]
            or [np.zeros(0, np.int64)]
        ).astype(np.int32)
        comm = np.repeat(
            np.array(list(self.comms), dtype=np.uint64), np.asarray(sizes, np.int64)
        )
        self.member_keys = np.unique(rows.pair_keys(member, comm))
        self.pair_rank, self.pair_comm = member.astype(np.int64), comm


def topology_problem(topo: Topology, c: Contract) -> tuple[Reason, str] | None:
    """The first contract rule ``topo`` breaks, with a detail, or ``None``."""
    if max(len(topo.job_id), len(topo.host)) > c.max_name_len:
        return Reason.TOO_LARGE, f"job id or host over {c.max_name_len} characters"
    if not c.min_time_ns <= topo.ts_ns <= c.max_time_ns:
        return Reason.TIME_RANGE, f"time {topo.ts_ns} ns is outside years 2000-2100"
    if len(topo.ranks) > c.max_ranks_per_host:
        return Reason.TOO_LARGE, f"{len(topo.ranks)} ranks on one host"
    ranks = [rt.rank for rt in topo.ranks]
    if len(set(ranks)) != len(ranks) or not all(0 <= r < MAX_WORLD for r in ranks):
        return Reason.BAD_TOPOLOGY, f"ranks {ranks[:16]} repeat or are out of range"
    for rt in topo.ranks:
        for m in rt.comms:
            problem = _membership_problem(rt.rank, m)
            if problem:
                return (
                    Reason.BAD_TOPOLOGY,
                    f"rank {rt.rank} in comm {comm_hex(m.comm)}: {problem}",
                )
    return None


def _membership_problem(rank: int, m: CommMembership) -> str:
    """A partial declaration (``membership.UNKNOWN`` at the positions the
    host does not know) is checked on what it declares: its channel and
    connection peers are only checked to be ranks, the members being
    unknown yet."""
    known = [r for r in m.ranks if r != UNKNOWN]
    members = set(known)
    if len(members) != len(known) or m.nranks != len(m.ranks):
        return f"nranks {m.nranks} but {len(m.ranks)} members, or members repeat"
    if not all(0 <= r < MAX_WORLD for r in known):
        return "a member rank is out of range"
    if not 0 <= m.comm_rank < m.nranks or m.ranks[m.comm_rank] != rank:
        return f"comm_rank {m.comm_rank} does not point at the rank"
    inside = members.__contains__ if len(known) == len(m.ranks) else _in_range
    for ch in m.channels:
        peers = (ch.ring_prev, ch.ring_next, ch.tree_parent, *ch.tree_children)
        if ch.channel < 0 or any(p != -1 and not inside(p) for p in peers):
            return f"channel {ch.channel} names a peer outside the comm"
    if any(not inside(cn.peer) or cn.channel < 0 for cn in m.connections):
        return "a connection names a peer outside the comm"
    return ""


def _in_range(rank: int) -> bool:
    return 0 <= rank < MAX_WORLD
