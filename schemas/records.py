"""In-memory record types: what the codec decodes to and encodes from.

Batched records (``StateBatch``, ``CompletionBatch``) hold structured numpy
arrays whose layouts are in ``columns.py``; the others are small dataclasses.
All timestamps are integers in nanoseconds since the Unix epoch on the
reporting host's clock, unless a name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from mycroft.schemas.columns import (
    DONE_FLOW_COLUMNS,
    DONE_OP_COLUMNS,
    FLOW_COLUMNS,
    OP_COLUMNS,
    RC_COLUMNS,
    empty,
)
from mycroft.schemas.vocab import Component, FaultKind, IncidentState


@dataclass(frozen=True)
class BatchHeader:
    """Identifies one batch from one node agent.

    ``(job_id, host, agent_epoch, agent_seq)`` is the dedup key downstream: a
    batch replayed after a broker outage carries the same key.
    """

    job_id: str
    host: str
    agent_epoch: int
    agent_seq: int
    tick_ns: int
    interval_ms: int


@dataclass
class StateBatch:
    """All in-flight state of one host at one sampling tick."""

    header: BatchHeader
    rc: np.ndarray = field(default_factory=lambda: empty(RC_COLUMNS))
    op: np.ndarray = field(default_factory=lambda: empty(OP_COLUMNS))
    flow: np.ndarray = field(default_factory=lambda: empty(FLOW_COLUMNS))


@dataclass
class CompletionBatch:
    """All ops one host completed during one tick."""

    header: BatchHeader
    op: np.ndarray = field(default_factory=lambda: empty(DONE_OP_COLUMNS))
    flow: np.ndarray = field(default_factory=lambda: empty(DONE_FLOW_COLUMNS))


@dataclass(frozen=True)
class RankHealth:
    """Per training process health as seen by the node agent."""

    rank: int
    pid: int
    last_write_ns: int
    ring_overwrites: int
    ring_corrupt: int
    dropped_comms: int = 0
    """What the writer's own BEAT counted lost or unseen (cumulative; the NCCL
    plugin's coverage counters, ``schemas/ring.md`` §4c; 0 from older agents)."""
    dropped_ops: int = 0
    dropped_flows: int = 0
    unseen_ops: int = 0
    abandoned_ops: int = 0
    orphan_flows: int = 0


@dataclass(frozen=True)
class NicPort:
    """One RDMA NIC port's state and link counters as the node agent read
    them (counters cumulative, -1 when unreadable)."""

    nic: str
    port: int
    up: bool
    link_downed: int
    link_recovered: int


@dataclass(frozen=True)
class Heartbeat:
    """Node agent liveness and every loss it knows of (all counters cumulative)."""

    job_id: str
    host: str
    agent_epoch: int
    ts_ns: int
    interval_ms: int
    sampling_lag_ms: float
    records_read: int
    batches_sent: int
    batches_spooled: int
    spool_pending: int
    spool_dropped: int
    delivery_failures: int
    ranks: tuple[RankHealth, ...] = ()
    nics: tuple[NicPort, ...] = ()


@dataclass(frozen=True)
class ChannelTopology:
    """Ring and tree neighbours of one rank on one channel (global ranks; -1: none)."""

    channel: int
    ring_prev: int
    ring_next: int
    tree_parent: int
    tree_children: tuple[int, ...] = ()


@dataclass(frozen=True)
class Connection:
    """One connection of a rank: a (peer, channel, direction) over a transport."""

    peer: int
    channel: int
    direction: str
    transport: str


@dataclass(frozen=True)
class CommMembership:
    """A rank's place in one communicator."""

    comm: int
    name: str
    nranks: int
    comm_rank: int
    ranks: tuple[int, ...]
    channels: tuple[ChannelTopology, ...] = ()
    connections: tuple[Connection, ...] = ()


@dataclass(frozen=True)
class RankTopology:
    """Where one rank runs and which communicators it belongs to."""

    rank: int
    local_rank: int
    gpu: str
    nic: str
    comms: tuple[CommMembership, ...] = ()


@dataclass(frozen=True)
class Topology:
    """Topology of all ranks of one host (compacted topic, key ``job/host``)."""

    job_id: str
    host: str
    ip: str
    ts_ns: int
    ranks: tuple[RankTopology, ...] = ()


@dataclass(frozen=True)
class Anomaly:
    """A detected symptom: something is wrong with these communicators."""

    anomaly_id: str
    job_id: str
    kind: FaultKind
    comms: tuple[int, ...]
    ranks: tuple[int, ...]
    onset_ns: int
    detected_ns: int
    detector: str
    summary: str
    score: float = 1.0
    emitted_wall_ns: int = 0


@dataclass(frozen=True)
class Culprit:
    """One suspect, best first in a root cause. ``peer``/``channel`` name the flow.

    ``scope`` says what is blamed: ``rank`` (one GPU and its process), ``nic``
    (the NIC ``device`` of ``host``, shared by ``ranks``), ``host`` (the whole
    host, ``ranks`` all of its ranks) or ``link`` (the flow ``rank -> peer``).
    ``rank`` is always one rank of the culprit, the one with the strongest
    evidence. ``rules`` names the scoring rules behind it, in the order they
    fired (``streams/core/evidence.py``; RootCause.3 on).
    """

    rank: int
    host: str
    component: Component
    kind: FaultKind
    confidence: float
    peer: int | None = None
    channel: int | None = None
    reason: str = ""
    scope: str = "rank"
    device: str | None = None
    ranks: tuple[int, ...] = ()
    rules: tuple[str, ...] = ()

    def subject(self) -> str:
        """The culprit in words: ``NIC mlx5_0 of node0004 (ranks 32, 33)``,
        ``host node0004 (ranks 32-39)``, ``link 5 -> 9 (node0001, channel 2)``
        or ``rank 5 on node0001``."""
        if self.scope == "nic" and self.device:
            return f"NIC {self.device} of {self.host} ({_rank_list(self.ranks)})"
        if self.scope == "host":
            return f"host {self.host} ({_rank_list(self.ranks)})"
        if self.scope == "link" and self.peer is not None:
            ch = "" if self.channel is None else f", channel {self.channel}"
            return f"link {self.rank} -> {self.peer} ({self.host}{ch})"
        return f"rank {self.rank} on {self.host}"


def _rank_list(ranks: tuple[int, ...]) -> str:
    """``ranks 32, 33``, ``ranks 32-39`` (a run of 3 or more), ``rank 5``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    run = len(ranks) >= 3 and list(ranks) == list(range(ranks[0], ranks[-1] + 1))
    body = f"{ranks[0]}-{ranks[-1]}" if run else ", ".join(map(str, ranks))
    return f"ranks {body}"


@dataclass(frozen=True)
class Evidence:
    """One step of the evidence chain, upstream last."""

    fact: str
    rank: int | None = None
    comm: int | None = None
    op_seq: int | None = None


@dataclass(frozen=True)
class RootCause:
    """The resolution of one incident. Revisions of an incident replace each other.

    The revision that closes an incident repeats the latest answer with
    ``state`` closed, ``closed_ns`` (trace clock) and ``close_reason``
    (RootCause.4 on). ``states_closure`` is not on the wire: False when the
    writer predates RootCause.4 and so never sends a closing revision;
    readers then fall back to their TTL.
    """

    incident_id: str
    revision: int
    job_id: str
    kind: FaultKind
    culprits: tuple[Culprit, ...]
    evidence: tuple[Evidence, ...]
    anomaly_ids: tuple[str, ...]
    onset_ns: int
    detected_ns: int
    resolved_ns: int
    emitted_wall_ns: int = 0
    state: IncidentState = IncidentState.OPEN
    closed_ns: int | None = None
    close_reason: str | None = None
    states_closure: bool = True

    @property
    def is_closed(self) -> bool:
        """Whether this revision closes its incident."""
        return self.state is IncidentState.CLOSED

    @property
    def detection_latency_s(self) -> float:
        """Onset to detection, seconds (trace clock)."""
        return (self.detected_ns - self.onset_ns) / 1e9

    @property
    def rca_latency_s(self) -> float:
        """Detection to root cause, seconds (trace clock)."""
        return (self.resolved_ns - self.detected_ns) / 1e9


class BlockState(StrEnum):
    """Where a rank of a stalled communicator stands at its frontier op."""

    IN_OP = "in_op"  # issued the op and has not completed it
    ABSENT = "absent"  # never issued the op its peers are in
    LOST = "lost"  # stopped reporting (silence detector)


@dataclass(frozen=True)
class BlockedRank:
    """One rank of a stalled communicator that has not completed its frontier op."""

    rank: int
    seq: int
    state: BlockState
    issue_ns: int = 0


@dataclass(frozen=True)
class CommStatus:
    """Stage-1 view of one communicator that needs the job stage's attention.

    ``kind`` says what ``culprits`` explain: a stall (hang), a slowdown or a
    mismatch seen in this communicator alone (its comm group's rows).
    """

    comm: int
    kind: FaultKind
    frontier_seq: int
    last_progress_ns: int
    stall_ns: int
    blocked: tuple[BlockedRank, ...] = ()
    culprits: tuple[Culprit, ...] = ()
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class CommSummary:
    """One evaluate tick of one (job, comm group) in the two-stage worker.

    Healthy communicators are only counted: ``comms`` lists those stalled,
    slow or mismatched, so the size is O(lagging ranks), not O(ranks).
    ``anomalies`` are the ones new since the previous summary; ``active`` the
    ids of every anomaly still firing at ``tick_ns``.
    """

    job_id: str
    group: int
    groups: int
    tick_ns: int
    data_ns: int
    comms_total: int
    rows: int
    comms: tuple[CommStatus, ...] = ()
    anomalies: tuple[Anomaly, ...] = ()
    active: tuple[str, ...] = ()
    emitted_wall_ns: int = 0


Record = (
    StateBatch
    | CompletionBatch
    | Heartbeat
    | Topology
    | Anomaly
    | RootCause
    | CommSummary
)
