"""Communicator members joined from the hosts' partial declarations.

A host that knows only its own ranks' places in a communicator (the NCCL
profiler plugin gives each rank the comm's size and its own position, not
the other members) declares it *in part*: a ``CommMembership`` whose
``ranks`` has ``nranks`` entries, the global rank at each position the host
knows and ``-1`` at the others (``UNKNOWN``). The comm's members are the
union of every host's declaration, complete once all ``nranks`` positions
are known. Until then the comm is not declared: rows of it wait in the gate
as rows of an undeclared (rank, comm) do. A host that declares a comm in
part sends that comm's flow ``peer`` s as positions in the comm; the gate
maps them to global ranks once the comm is complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mycroft.schemas.records import CommMembership, RankTopology, Topology
from mycroft.schemas.text import comm_hex

UNKNOWN = -1
"""A position of a partial declaration the declaring host does not know."""


def is_partial(m: CommMembership) -> bool:
    """Whether ``m`` declares only some positions of its comm (an ``UNKNOWN``)."""
    return UNKNOWN in m.ranks


@dataclass
class MembershipJoin:
    """Positions of communicators declared in part, per comm, until complete.

    ``parts`` holds comms still incomplete (position -> global rank);
    ``relative`` the comms each host declared in part in its latest record
    (their flow peers are positions); ``records`` the latest record of each
    such host, to pass on again, filled in, when one of its comms completes.
    """

    parts: dict[int, dict[int, int]] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    relative: dict[str, frozenset[int]] = field(default_factory=dict)
    records: dict[str, Topology] = field(default_factory=dict)

    def conflict(self, topo: Topology, full: dict[int, tuple[int, ...]]) -> str:
        """Why ``topo`` contradicts what is known (``full``: complete comms),
        or ``""``: two global ranks at one position, one rank at two, or
        another size."""
        seen: dict[int, dict[int, int]] = {}
        for rt in topo.ranks:
            for m in rt.comms:
                known = seen.setdefault(m.comm, self._known(m.comm, full))
                size = len(full[m.comm]) if m.comm in full else self.sizes.get(m.comm)
                if size is not None and size != m.nranks:
                    return (
                        f"comm {comm_hex(m.comm)}: nranks {m.nranks}, declared {size}"
                    )
                problem = _merge(known, m.ranks)
                if problem:
                    return f"comm {comm_hex(m.comm)}: {problem}"
        return ""

    def declare(self, topo: Topology, full: dict[int, tuple[int, ...]]) -> list[int]:
        """Fold ``topo``'s partial declarations in (``conflict`` found none);
        complete comms move to ``full``. Returns the comms completed now."""
        done: list[int] = []
        rel: set[int] = set()
        for m in (m for rt in topo.ranks for m in rt.comms if is_partial(m)):
            rel.add(m.comm)
            if m.comm in full:
                continue
            known = self.parts.setdefault(m.comm, {})
            self.sizes[m.comm] = m.nranks
            _merge(known, m.ranks)
            if len(known) == m.nranks:
                full[m.comm] = tuple(known[i] for i in range(m.nranks))
                del self.parts[m.comm], self.sizes[m.comm]
                done.append(m.comm)
        self.relative[topo.host] = frozenset(rel)
        if rel:
            self.records[topo.host] = topo
        else:
            self.records.pop(topo.host, None)
        return done

    def waiting_on(self, comms: list[int], but: str) -> list[Topology]:
        """The latest records of hosts other than ``but`` that declared any
        of ``comms`` in part (to pass on again, now that they are complete)."""
        want = set(comms)
        return [
            t for h, t in sorted(self.records.items())
            if h != but and self.relative.get(h, frozenset()) & want
        ]  # fmt: skip

    def forget(self, host: str) -> None:
        """``host`` left: its record is not passed on again (positions stay)."""
        self.relative.pop(host, None)
        self.records.pop(host, None)

    def _known(self, comm: int, full: dict[int, tuple[int, ...]]) -> dict[int, int]:
        if comm in full:
            return dict(enumerate(full[comm]))
        return dict(self.parts.get(comm, {}))


def resolved(topo: Topology, full: dict[int, tuple[int, ...]]) -> Topology:
    """``topo`` with each partial declaration of a complete comm filled in and
    those of incomplete comms left out (``topo`` itself when it has none)."""
    if not any(is_partial(m) for rt in topo.ranks for m in rt.comms):
        return topo
    ranks = tuple(
        RankTopology(
            rt.rank, rt.local_rank, rt.gpu, rt.nic,
            tuple(_filled(m, full) for m in rt.comms
                  if not is_partial(m) or m.comm in full),
        )
        for rt in topo.ranks
    )  # fmt: skip
    return replace(topo, ranks=ranks)


def _filled(m: CommMembership, full: dict[int, tuple[int, ...]]) -> CommMembership:
    return replace(m, ranks=full[m.comm]) if is_partial(m) else m


def _merge(known: dict[int, int], ranks: tuple[int, ...]) -> str:
    """Add the known positions of ``ranks`` to ``known``; a conflict's text."""
    where = {r: i for i, r in known.items()}
    for i, r in enumerate(ranks):
        if r == UNKNOWN:
            continue
        if known.get(i, r) != r:
            return f"position {i} is rank {known[i]} and rank {r}"
        if where.get(r, i) != i:
            return f"rank {r} is at positions {where[r]} and {i}"
        known[i], where[r] = r, i
    return ""
