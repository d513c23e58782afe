"""Escalation is a consequence, not a cause.

After one rank fails (a crash, a dead NIC, a hung GPU), the job tears the
others down: gloo fails the peers' next collective as the dead rank's
sockets close, NCCL's watchdog aborts each process once its op waited the
timeout, torchrun ends the workers it has left. Their rings vanish or
freeze and their liveness beats stop, after the first rank's did. A lost
rank whose last sign of life came more than ``escalation_lead_s`` (plus one
host reporting interval) after the job's first rank stopped is that
failure's consequence: no silence anomaly names it and the hang's root
cause does not blame it. Within that lead, a rank whose ring vanished (it
exited through its handlers, as a peer does on a collective's error) is
the consequence of one whose ring froze (it died without unwinding). So is
a rank that stopped after a busy comm's
stall had passed its hang threshold (a hung GPU's process lives on until
the watchdog aborts it with the rest). The job, not the rank's own comms: a blocked job
waits on its first failure through every comm, and its teardown reaches
ranks that share none with it. Ranks that stop together stay suspects alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # detect.py calls this module: no import cycle at run time
    from mycroft.streams.core.detect import DetectContext

Lost = dict[int, tuple[str, int]]
"""``rank -> (how, last sign of life ns)``, as :func:`detect.lost_ranks`."""


def last_signs_ns(ctx: DetectContext, lost: Lost) -> np.ndarray:
    """Each rank's last sign of life, ns, indexed by rank (0: none known).

    A lost rank's is the one :func:`detect.lost_ranks` found; any other's is
    its newest ``seen_ns`` (the liveness beat), so a rank that stopped but
    is not yet past the silence threshold already counts as stopped then.
    """
    s = ctx.store.slots
    ranks = s["rank"].astype(np.int64)
    out = np.zeros(int(ranks.max(initial=-1)) + 1, np.int64)
    np.maximum.at(out, ranks, s["seen_ns"].astype(np.int64))
    for rank, (_how, last_ns) in lost.items():
        if rank < len(out):
            out[rank] = last_ns
    return out


def _lead_ns(ctx: DetectContext) -> int:
    gaps = [h.gap_ns for h in ctx.store.hosts.values() if h.gap_ns > 0]
    interval = float(np.median(gaps)) if gaps else 0.0
    return int(ctx.cfg.escalation_lead_s * 1e9 + interval)


def consequences(
    ctx: DetectContext, lost: Lost, hung_since_ns: int | None = None
) -> set[int]:
    """Lost ranks that stopped after the job was already failing: more than
    the lead after its first rank stopped, or after ``hung_since_ns`` (when
    a busy comm's stall passed its hang threshold; None: no hang yet)."""
    if not lost:
        return set()
    last = last_signs_ns(ctx, lost)
    known = last[last > 0]
    if not len(known):
        return set()
    lead = _lead_ns(ctx)
    ref_ns = int(known.min()) + lead
    if hung_since_ns is not None:
        ref_ns = min(ref_ns, hung_since_ns)
    later = {rank for rank, (_how, t) in lost.items() if t > ref_ns}
    return later | exited_after_a_death(lost, lead)


def exited_after_a_death(lost: Lost, lead_ns: int) -> set[int]:
    """Ranks whose rows vanished (an exit that ran its handlers: the process
    saw an error and left) no earlier than a lead before a frozen rank's
    last beat (it died without unwinding): the exits are its consequence,
    even where the two stops are too close to order by time."""
    frozen = [t for how, t in lost.values() if how == "seen"]
    if not frozen:
        return set()
    died_ns = min(frozen)
    return {
        rank
        for rank, (how, t) in lost.items()
        if how == "rows" and t >= died_ns - lead_ns
    }
