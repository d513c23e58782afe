"""What root-cause rules observe: one ``Rule`` per scoring rule, and the
``Observation`` each rule records against a suspect.

The weight and component of every rule live in ``scoring.py``; this module
only names what each rule sees. Hang rules read the frozen G/T/D counters
(gpu_ready, transmitted, done) of the blocked op, slowdown rules the
timing of completed ops and the counter gaps of cross-host flows, port
rules the NIC port events of heartbeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum, auto

from mycroft.schemas.vocab import Component


class Rule(StrEnum):
    """A scoring rule; its value is the name a culprit carries."""

    # Hang: a rank that went silent (lost).
    LOST_FROZEN_SEND = auto()
    """A lost rank's last send flows froze ready-not-sent (G>T)."""
    NIC_ALL_RANKS_LOST = auto()
    """Every rank behind one NIC went silent, their host still reporting."""
    HOST_STOPPED = auto()
    """A whole host stopped reporting."""
    HOST_STOPPED_NIC = auto()
    """A whole host stopped reporting: its NIC may be down instead."""
    DIED_IDLE = auto()
    """A lost rank had completed all it issued: its process died between ops."""
    DIED_IDLE_HOST = auto()
    """A lost rank had completed all it issued: or its host thread stopped."""
    RECORDS_STOPPED = auto()
    """A lost rank in an op stopped reporting while its host still reports."""
    # Hang: a live rank at the blocked point.
    NEVER_ISSUED = auto()
    """An alive rank never issued the op its peers wait in."""
    SEND_TO_UNREADY = auto()
    """A send flow froze ready-not-sent toward a receiver not ready."""
    RECEIVER_NIC_STOPPED = auto()
    """Data froze ready-not-sent (G>T) toward a rank while the sender's NIC
    kept working: the receiving NIC stopped."""
    RECEIVER_NIC_SILENT = auto()
    """Data froze ready-not-sent (G>T) toward a rank whose NIC moved nothing
    since: the receiving end cannot be told from the sending one."""
    FROZEN_READY_NOT_SENT = auto()
    """Send flows froze ready-not-sent (G>T) to a receiver that is ready."""
    SENT_NOT_DONE_INTO = auto()
    """Peers' send flows into the rank transmitted, never done (T>D)."""
    NEVER_MOVED = auto()
    """The rank is in the op and never moved a chunk while its peers did."""
    UNCONSUMED_INPUT = auto()
    """The rank holds input it did not consume (G=T=D frozen)."""
    MUTUAL_UNSTARTED = auto()
    """Ranks wait on each other in an op none of them moved a chunk in."""
    NO_BUFFER_OFFERED = auto()
    """Of ranks waiting on each other with nothing moved, the rank whose
    same-host receive flows offered no buffer (a kernel-driven transport)
    while the others' did."""
    FIRST_TO_STOP = auto()
    """The rank stopped progressing well before the next one."""
    ORDER_CYCLE = auto()
    """The rank issued a cycle's comms in another order than the majority."""
    COMM_ORDER_CYCLE = auto()
    """Comm-level order deadlock: the rank is stuck in another comm than
    the majority of the cycle's blocked ranks."""
    # Port events of heartbeats.
    PORT_DOWN = auto()
    """The rank's NIC port went down or flapped since the incident began."""
    PORT_STAYED_UP = auto()
    """The rank's port stayed up while another suspect's went down."""
    PORT_FLAPPING = auto()
    """A port of the rank's NIC kept going down in recent heartbeats."""
    # Slowdown: cross-host flow gaps.
    LINK_TD_LAG = auto()
    """Cross-host flows touching a host keep a transmitted-not-done lag (T-D)."""
    NIC_TD_LAG = auto()
    """Every flow with a transmitted-not-done lag (T-D) goes through one NIC
    while another NIC of its host moves data normally."""
    PCIE_TD_LAG = auto()
    """Most of the transmitted-not-done lag (T-D) drains into one GPU from
    several NICs, its NIC mates receiving normally."""
    SWITCH_BACKLOG = auto()
    """Ready-not-sent backlog (G-T) spread over many NICs: congestion between
    hosts, named on the host most flows touch."""
    NIC_SEND_BACKLOG = auto()
    """Ready-not-sent backlog (G-T) on flows sent through one NIC."""
    PROXY_SEND_BACKLOG = auto()
    """Ready-not-sent backlog (G-T) on one GPU's sends only, its NIC mate
    sending normally."""
    PROXY_FREEZE = auto()
    """A NIC backlog whose T froze in 1-2 long episodes: the send proxy."""
    NIC_RECEIVE_BACKLOG = auto()
    """Ready-not-sent backlog (G-T) into both GPUs of one NIC."""
    NIC_PCIE_BACKLOG = auto()
    """Ready-not-sent backlog (G-T) into one GPU of the NIC most flows touch."""
    PCIE_BACKLOG = auto()
    """Most of the ready-not-sent backlog (G-T) drains into one GPU from
    several NICs."""
    SLOW_TRANSFERS = auto()
    """The network transfers through one part (a rank's path to its NIC, a
    NIC side, a host) spend longer on the wire than in their own history,
    beyond the job's change (``transfer_times``)."""
    # Slowdown: timing of completed ops.
    HOST_WIDE_LATE = auto()
    """Every rank of a host arrives late and its intra-host ops slowed."""
    SLOW_COMPUTE = auto()
    """A late rank computes longer between ops than its on-time peers."""
    LATE_ARRIVAL = auto()
    """The rank issues its ops late."""
    HOLDS_BACK = auto()
    """The rank alone keeps a group waiting on some of its ops (one op a
    step), a real share of the group's time."""
    READY_LAGS = auto()
    """The rank's gpu_ready lags its peers' while it issues on time."""
    FINISHES_LAST = auto()
    """The rank issues on time but finishes after the median."""
    # Mismatch.
    MISMATCH_MINORITY = auto()
    """The rank's op signature differs from the majority's at one op."""
    # Across suspects.
    EXPLAINED_AWAY = auto()
    """Flow gaps another suspect's direct evidence explains (its port went
    down, its own compute slowed): capped below that suspect."""


class Subject(StrEnum):
    """What an observation is about."""

    RANK = auto()
    NIC = auto()
    HOST = auto()
    LINK = auto()


@dataclass(frozen=True)
class Observation:
    """One rule's observation against a suspect rank.

    ``score`` is what the rule added to ``component`` (for a rule that
    scales scores, the factor); ``flow`` is ``(peer, channel)`` when the
    rule read one flow.
    """

    rule: Rule
    subject: Subject
    rank: int
    component: Component | None
    score: float
    reason: str
    flow: tuple[int, int] | None = None
