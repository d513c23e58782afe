"""Root cause of a mismatch: the minority signature at one (comm, seq)."""

from __future__ import annotations

from collections.abc import Sequence

from mycroft.schemas.records import Anomaly, Culprit, Evidence
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.scoring import MAJORITY


def explain_mismatch(
    ctx: DetectContext, anomalies: Sequence[Anomaly]
) -> tuple[list[Culprit], list[Evidence]]:
    """Blame the ranks outside the majority signature (component ``config``).

    Confidence is lower when the comm has two members (no majority exists).
    """
    rca = ctx.cfg.rca
    culprits: list[Culprit] = []
    evidence: list[Evidence] = []
    for a in sorted(anomalies, key=lambda a: a.onset_ns):
        comm = a.comms[0] if a.comms else None
        size = len(ctx.topo.members(comm)) if comm is not None else 0
        conf = (
            rca.weight(Rule.MISMATCH_MINORITY)
            if size >= MAJORITY
            else rca.mismatch_pair_conf
        )
        evidence.append(Evidence(a.summary, comm=comm))
        for r in a.ranks:
            if any(c.rank == r for c in culprits):
                continue
            culprits.append(
                Culprit(
                    rank=r,
                    host=ctx.topo.host_of(r),
                    component=Component.CONFIG,
                    kind=FaultKind.MISMATCH,
                    confidence=conf / max(len(a.ranks), 1),
                    reason=f"op differs from the majority: {a.summary}",
                    rules=(Rule.MISMATCH_MINORITY.value,),
                )
            )
    return culprits, evidence
