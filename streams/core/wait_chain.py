"""Control dependencies across groups: follow waiting ranks to what they wait on.

A rank in an unfinished op of group ``g`` (sequence ``s``) waits on every
member of ``g`` that has not issued ``s`` yet. Such a member is either

* without a dump or records: it died (a crash suspect, ``process``);
* alive and in no op: its CPU never issued the op (``host``);
* itself in an unfinished op, of any group: the wait goes on through it.

Following the waits from every blocked op ends at such ranks, or in a cycle
of waits across groups that reaches none: two groups whose ops the ranks
issue in different orders (a collective-order bug, ``config``). Pure: the
caller says per rank what it issued and is blocked in; nothing here reads
time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mycroft.schemas.vocab import Component

Node = tuple[int, str, int]
"""An unfinished op of one rank: ``(rank, group, seq)``."""


@dataclass(frozen=True)
class WaitState:
    """What each rank issued and is blocked in.

    Attributes:
        members: Global ranks of each group.
        issued: Highest sequence number each ``(rank, group)`` issued (absent:
            none).
        open_ops: Per rank, the ``(group, seq)`` of its unfinished ops.
        no_dump: Ranks without a dump or any records.
        ops: Op name per ``(group, seq)``, for the evidence text (optional).
        peer_waits: Ranks an unfinished op waits on, given outright instead
            of read from ``issued`` (a send or recv waits on its peer; empty
            when the peer sits in the matching op).
    """

    members: Mapping[str, tuple[int, ...]]
    issued: Mapping[tuple[int, str], int]
    open_ops: Mapping[int, tuple[tuple[str, int], ...]]
    no_dump: frozenset[int]
    ops: Mapping[tuple[str, int], str]
    peer_waits: Mapping[Node, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ChainCause:
    """Where a chain of waits ends.

    Attributes:
        rank: The rank the others wait on (for a cycle: the rank whose issue
            order the fewest ranks share, the lowest on a tie).
        component: ``process`` (no dump), ``host`` (idle) or ``config`` (cycle).
        waiting: Every rank whose waits lead here, sorted.
        evidence: What the ranks wait in, and for a cycle the two orders.
        cycle: The ranks of a cycle, sorted (empty otherwise).
    """

    rank: int
    component: Component
    waiting: tuple[int, ...]
    evidence: str
    cycle: tuple[int, ...] = ()


def _lagging(s: WaitState, node: Node) -> list[int]:
    """Members of the node's group that have not issued its op (for a
    point-to-point op: its ``peer_waits``)."""
    if node in s.peer_waits:
        return list(s.peer_waits[node])
    rank, group, seq = node
    members = s.members.get(group, ())
    return [m for m in members if m != rank and s.issued.get((m, group), -1) < seq]


def _edges(s: WaitState) -> dict[Node, list[Node | int]]:
    """Each unfinished op -> the unfinished ops (or idle/dead ranks) it waits on."""
    out: dict[Node, list[Node | int]] = {}
    for rank, ops in s.open_ops.items():
        for group, seq in ops:
            nxt: list[Node | int] = []
            for m in _lagging(s, (rank, group, seq)):
                theirs = s.open_ops.get(m, ())
                if m in s.no_dump or not theirs:
                    nxt.append(m)
                else:
                    nxt.extend((m, g, q) for g, q in theirs)
            out[(rank, group, seq)] = nxt
    return out


def _sccs(edges: Mapping[Node, list[Node | int]]) -> list[list[Node]]:
    """Strongly connected components, sinks first (Tarjan, iterative)."""
    index: dict[Node, int] = {}
    low: dict[Node, int] = {}
    stack: list[Node] = []
    on: set[Node] = set()
    out: list[list[Node]] = []
    for root in edges:
        if root in index:
            continue
        work: list[tuple[Node, int]] = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on.add(v)
            succ = [w for w in edges[v] if isinstance(w, tuple)]
            if i < len(succ):
                work.append((v, i + 1))
                w = succ[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
    return out


Ends = frozenset[int | tuple[Node, ...]]


def _reach(edges: Mapping[Node, list[Node | int]]) -> dict[Node, Ends]:
    """Per node, the ranks (or closed cycles) its waits end at."""
    reach: dict[Node, Ends] = {}
    for comp in _sccs(edges):
        inside = set(comp)
        ends: set[int | tuple[Node, ...]] = set()
        for v in comp:
            for w in edges[v]:
                if isinstance(w, int):
                    ends.add(w)
                elif w not in inside:
                    ends |= reach[w]
        looped = len(comp) > 1 or comp[0] in edges[comp[0]]
        if not ends and looped:
            ends.add(tuple(sorted(comp)))
        for v in comp:
            reach[v] = frozenset(ends)
    return reach


def _where(s: WaitState, nodes: list[Node]) -> str:
    """``"ranks [0, 1] in all_reduce #12 of group 1"`` per op, joined."""
    by_op: dict[tuple[str, int], list[int]] = {}
    for rank, group, seq in nodes:
        by_op.setdefault((group, seq), []).append(rank)
    return "; ".join(
        f"ranks {sorted(set(r))} in {s.ops.get(k, 'op')} #{k[1] + 1} of group {k[0]}"
        for k, r in sorted(by_op.items())
    )


def _rank_cause(
    s: WaitState, rank: int, edges: Mapping[Node, list[Node | int]], waiting: list[int]
) -> ChainCause:
    direct = [v for v, ws in edges.items() if rank in ws]
    if rank in s.no_dump:
        what = "left no dump or records (the process died)"
        comp = Component.PROCESS
    else:
        what = "is alive and in no op: its CPU never issued the op"
        comp = Component.HOST
    text = f"rank {rank} {what} while {_where(s, direct)} wait on it"
    return ChainCause(rank, comp, tuple(sorted(set(waiting))), text)


def _name(s: WaitState, group: str, seq: int) -> str:
    return f"{s.ops.get((group, seq), 'op')} #{seq + 1} of group {group}"


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {sorted(ranks)}"


def _order(s: WaitState, cycle: tuple[Node, ...]) -> ChainCause:
    """A closed cycle of waits: the issue orders of its ranks, ranks sharing
    an order together; the rank of the least shared order is named."""
    orders: dict[str, list[int]] = {}
    for rank, group, seq in cycle:
        after = [
            _name(s, g, q)
            for _r, g, q in dict.fromkeys(cycle)
            if rank in s.members.get(g, ()) and s.issued.get((rank, g), -1) < q
        ]
        text = f"{_name(s, group, seq)} before {', '.join(dict.fromkeys(after))}"
        orders.setdefault(text, []).append(rank)
    ranks = tuple(sorted({r for r, _g, _q in cycle}))
    odd = min(orders.values(), key=lambda rs: (len(rs), min(rs)))
    text = "collective-order deadlock across groups: " + "; ".join(
        f"{_who(rs)} issued {order}"
        for order, rs in sorted(orders.items(), key=lambda kv: min(kv[1]))
    )
    return ChainCause(min(odd), Component.CONFIG, ranks, text, ranks)


def follow(s: WaitState) -> list[ChainCause]:
    """Where the waits of every blocked op end, most waited-on first.

    Returns:
        One cause per rank (crash suspect or idle) or closed cycle that some
        blocked op waits on, sorted by how many ranks wait on it.
    """
    edges = _edges(s)
    reach = _reach(edges)
    waiting: dict[int | tuple[Node, ...], list[int]] = {}
    for node, ends in reach.items():
        for end in ends:
            waiting.setdefault(end, []).append(node[0])
    out = [
        _order(s, end) if isinstance(end, tuple) else _rank_cause(s, end, edges, ranks)
        for end, ranks in waiting.items()
    ]
    return sorted(out, key=lambda c: (-len(c.waiting), c.rank))
