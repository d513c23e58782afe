"""The wait-for chain of a root cause, as edges between ranks.

Hang root cause states each step of the chain from a blocked rank to the
culprit as an evidence fact ``rank U waits on rank V (KIND: WHY)``
(``streams/core/rca_hang.py``), with ``U`` as the fact's rank. A slowdown
has no such chain (every rank still progresses): its chain is the culprits'
flows ``rank -> peer`` themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mycroft.schemas.records import RootCause

_WAIT = re.compile(
    r"^rank (?P<u>\d+) waits on rank (?P<v>\d+) \((?P<kind>\w+): (?P<why>.*)\)$"
)


@dataclass(frozen=True)
class Edge:
    """``src`` cannot progress until ``dst`` does (or: the culprit flow)."""

    src: int
    dst: int
    kind: str  # data, control, or flow (a culprit's link)
    why: str


def chain_of(rc: RootCause) -> list[Edge]:
    """The wait-for edges the evidence states, in order, each once; or, when
    it states none, each culprit's flow to its peer."""
    out: dict[tuple[int, int], Edge] = {}
    for ev in rc.evidence:
        m = _WAIT.match(ev.fact)
        if m is not None:
            key = (int(m["u"]), int(m["v"]))
            out.setdefault(key, Edge(*key, m["kind"], m["why"]))
    if out:
        return list(out.values())
    for c in rc.culprits:
        if c.peer is not None and (c.rank, c.peer) not in out:
            ch = "" if c.channel is None else f" channel {c.channel}"
            out[(c.rank, c.peer)] = Edge(c.rank, c.peer, "flow", f"{c.component}{ch}")
    return list(out.values())
