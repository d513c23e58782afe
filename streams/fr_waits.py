"""Wait chains of Flight Recorder dumps: who the blocked ranks wait on.

Builds the core's ``WaitState`` from the dumps (a rank's unfinished ops, the
highest sequence it issued per group, the ranks without a dump or entries)
and turns ``wait_chain.follow``'s causes into root-cause rows. An unfinished
op counts as a wait once it is older than the core's shortest hang
(``DetectorConfig.hang_min_s``) when its rank's dump was written, or at once
when a member it waits on left no dump: a dump written at a healthy exit
holds ops still in flight, which are no hang. A send or recv waits on its
peer unless the peer sits in the matching op (``p2p_seq_id`` numbers them
per rank, so they are matched by peer and direction only).
"""

from __future__ import annotations

from typing import Any

from mycroft.producers.torch.frdump import FrDumps, FrEntry
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.wait_chain import ChainCause, Node, WaitState, follow


def _issued(d: FrDumps) -> dict[tuple[int, str], int]:
    out: dict[tuple[int, str], int] = {}
    for rank, rows in d.entries.items():
        for e in rows:
            out[(rank, e.pg)] = max(out.get((rank, e.pg), -1), e.seq)
    return out


def _dead(d: FrDumps) -> frozenset[int]:
    """Ranks of the world without a dump, or whose dump holds no entry."""
    return frozenset(d.missing) | {r for r, rows in d.entries.items() if not rows}


def _open(d: FrDumps, e: FrEntry, min_ns: int) -> bool:
    """Unfinished and, when its rank's dump was written, a hang old."""
    if e.retired or e.state == "completed":
        return False
    return d.mtime_ns.get(e.rank, 0) - e.created_ns >= min_ns


def _waits(
    d: FrDumps, e: FrEntry, issued: dict[tuple[int, str], int], min_ns: int
) -> bool:
    """Whether ``e`` (unfinished) is a wait: old enough, or on a dead rank."""
    if not _open(d, e, 0) or _open(d, e, min_ns):
        return _open(d, e, min_ns)
    lagging = [m for m in d.groups.get(e.pg, ()) if issued.get((m, e.pg), -1) < e.seq]
    return bool(set(lagging) & _dead(d))


def _peer(d: FrDumps, e: FrEntry) -> int:
    """Global rank of a send's or recv's peer; -1 when its group is unknown."""
    members = d.groups.get(e.pg, ())
    return members[e.peer] if 0 <= e.peer < len(members) else -1


def _p2p(d: FrDumps, min_ns: int) -> dict[Node, tuple[int, ...]]:
    """Each open send or recv -> its peer, or nobody when the peer sits in
    the matching op (the two met: what stalls them is not a wait)."""
    live = {r: [e for e in rows if _open(d, e, min_ns)] for r, rows in d.p2p.items()}
    out: dict[Node, tuple[int, ...]] = {}
    for rank, rows in live.items():
        for e in rows:
            peer = _peer(d, e)
            if peer < 0:
                continue
            met = any(o.op != e.op and _peer(d, o) == rank for o in live.get(peer, []))
            out[(rank, f"{e.pg}/p2p", e.p2p_seq)] = () if met else (peer,)
    return out


def wait_state(d: FrDumps, config: DetectorConfig | None = None) -> WaitState:
    """The core's view of what every rank of the dumps waits in."""
    min_ns = int((config or DetectorConfig()).hang_min_s * 1e9)
    issued = _issued(d)
    peer_waits = _p2p(d, min_ns)
    open_ops = {
        rank: tuple((e.pg, e.seq) for e in rows if _waits(d, e, issued, min_ns))
        + tuple((g, q) for r, g, q in peer_waits if r == rank)
        for rank, rows in d.entries.items()
    }
    ops = {(e.pg, e.seq): e.op for rows in d.entries.values() for e in rows}
    ops |= {(f"{e.pg}/p2p", e.p2p_seq): e.op for rows in d.p2p.values() for e in rows}
    return WaitState(d.groups, issued, open_ops, _dead(d), ops, peer_waits)


def with_chain(
    d: FrDumps,
    named: list[dict[str, Any]],
    job_id: str,
    config: DetectorConfig | None = None,
) -> list[dict[str, Any]]:
    """The core's rows behind the rows of where the dumps' waits end.

    A core hang row naming a rank the chain shows waiting on another is
    dropped: that rank is a victim. The chain's first row is the best,
    unless a mismatch is named: ops whose sizes or types differ make the
    backend abort or hang the ranks (gloo kills the rank that detects it),
    so the waits are its consequence and follow it.
    """
    causes = follow(wait_state(d, config))
    if not causes:
        return named
    newest = max((e.created_ns for rows in d.entries.values() for e in rows), default=0)
    rows = [_row(c, job_id, newest / 1e9, len(causes)) for c in causes]
    if any(r["kind"] == "mismatch" for r in named):
        return named + rows
    ends = {c.rank for c in causes}
    victims = {r for c in causes for r in c.waiting} - ends
    kept = [
        r
        for r in named
        if r["rank"] not in ends and not (r["kind"] == "hang" and r["rank"] in victims)
    ]
    for r in kept:
        r["best"] = False
    rows[0]["best"] = True
    return rows + kept


def _row(c: ChainCause, job_id: str, when_s: float, n: int) -> dict[str, Any]:
    key = "order-cycle" if c.cycle else f"wait-chain-{c.component.value}"
    return {
        "incident_id": f"{job_id}:hang:{key}:{c.rank}",
        "revision": 0,
        "best": False,
        "rank": c.rank,
        "host": "",
        "peer": None,
        "channel": None,
        "component": c.component.value,
        "kind": "hang",
        "confidence": round(0.9 / n, 3),
        "reason": f"{c.evidence} (waiting: ranks {list(c.waiting)})",
        "onset_s": when_s,
        "detected_at_s": when_s,
        "resolved_at_s": when_s,
    }
