"""Small Anomaly and RootCause factories for the sink tests."""

from __future__ import annotations

from dataclasses import replace

from mycroft.schemas.records import Anomaly, Culprit, Evidence, RootCause
from mycroft.schemas.vocab import Component, FaultKind, IncidentState

T0 = 1_700_000_000_000_000_000


def anomaly(aid: str = "a-1", job: str = "job-1", latency_s: float = 2.0) -> Anomaly:
    return Anomaly(
        anomaly_id=aid, job_id=job, kind=FaultKind.HANG, comms=(2**64 - 1,),
        ranks=(0, 1, 2), onset_ns=T0, detected_ns=T0 + int(latency_s * 1e9),
        detector="stall", summary="ring stalled",
    )  # fmt: skip


def root_cause(
    incident: str = "i-1",
    revision: int = 0,
    *,
    job: str = "job-1",
    rank: int = 3,
    host: str = "node-a",
    component: Component = Component.NIC,
    confidence: float = 0.8,
) -> RootCause:
    culprit = Culprit(
        rank, host, component, FaultKind.HANG, confidence, peer=4,
        reason=f"rank {rank} never sent", rules=("frozen_ready_not_sent",),
    )  # fmt: skip
    return RootCause(
        incident_id=incident, revision=revision, job_id=job, kind=FaultKind.HANG,
        culprits=(culprit,), evidence=(Evidence("rank 3 never sent", rank=3),),
        anomaly_ids=("a-1",), onset_ns=T0, detected_ns=T0 + 2_000_000_000,
        resolved_ns=T0 + 2_500_000_000,
    )  # fmt: skip


def closed(rc: RootCause, quiet_s: float = 5.2) -> RootCause:
    """``rc`` as the revision that closes its incident."""
    return replace(
        rc,
        state=IncidentState.CLOSED,
        closed_ns=rc.resolved_ns + int(quiet_s * 1e9),
        close_reason=f"quiet for {quiet_s:.1f} s of event time (incident_quiet_s 5)",
    )
