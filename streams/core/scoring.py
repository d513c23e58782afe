"""The scoring model: what each rule adds to which component, and the caps.

Every root-cause rule (``evidence.Rule``) adds a score to one component of
a suspect rank; a suspect's culprit is its highest-scored component, and
its confidence that score's share of all suspects' best scores
(``suspect.rank_suspects``). ``WEIGHTS`` is the one table of those scores.
A rule whose score grows with what it saw keeps its base weight here and
its formula in ``RcaConfig`` (``link_score``, ``timing_score``, ...).

Two rules do not add: ``FIRST_TO_STOP`` adds to whichever component already
leads the suspect, and ``PORT_STAYED_UP`` multiplies the suspect's data-path
scores. ``MISMATCH_MINORITY`` and ``COMM_ORDER_CYCLE`` name culprits
directly: their weight is a confidence, split among the ranks named.

The weights here are defaults: ``rca_config.RcaConfig`` may override any
of them, and holds the caps and the formulas (``link_score``,
``timing_score``, ...) that read them.

``streams/core/README.md`` lists the table (a unit test keeps it in step).
"""

from __future__ import annotations

from typing import NamedTuple

from mycroft.schemas.vocab import Component
from mycroft.streams.core.evidence import Rule, Subject


class Weight(NamedTuple):
    """How one rule scores: on what, how much, and why."""

    component: Component | None  # None: see the module docstring
    weight: float
    subject: Subject
    why: str


LINK_BASE = 2.0
"""Base score of a link verdict; ``link_score`` grows it with the flows."""

PORT_SCORE = 1.5
"""Added to the nic score of a data-path suspect whose port went down: above
the gpu score a rank gets for moving nothing (a rank behind a dead port
moves nothing either)."""

QUIET_SHARE = 0.5
"""Share of its data-path scores a suspect keeps when its port stayed up
while another data-path suspect's went down."""

_N, _G, _H, _P = Component.NIC, Component.GPU, Component.HOST, Component.PCIE
_RANK, _NIC, _HOST, _LINK = Subject.RANK, Subject.NIC, Subject.HOST, Subject.LINK

WEIGHTS: dict[Rule, Weight] = {
    Rule.LOST_FROZEN_SEND: Weight(
        _N, 2.0, _NIC, "data it could not post before it went silent"
    ),
    Rule.NIC_ALL_RANKS_LOST: Weight(_N, 1.5, _NIC, "what its ranks share is the NIC"),
    Rule.HOST_STOPPED: Weight(_H, 1.5, _HOST, "a silent host, no flow evidence"),
    Rule.HOST_STOPPED_NIC: Weight(_N, 0.5, _NIC, "a dead NIC silences a host too"),
    Rule.DIED_IDLE: Weight(
        Component.PROCESS, 2.0, _RANK, "its beat stopped between ops"
    ),
    Rule.DIED_IDLE_HOST: Weight(_H, 1.0, _HOST, "or its host stopped feeding it"),
    Rule.RECORDS_STOPPED: Weight(
        Component.PROCESS, 2.0, _RANK, "its host reports, the rank does not"
    ),
    Rule.NEVER_ISSUED: Weight(_H, 2.0, _RANK, "the host side never issued the op"),
    Rule.SEND_TO_UNREADY: Weight(_N, 0.3, _LINK, "remote cause: weak evidence"),
    Rule.RECEIVER_NIC_STOPPED: Weight(
        _N, 1.5, _NIC, "the sender's NIC still works: the far end stopped"
    ),
    Rule.RECEIVER_NIC_SILENT: Weight(
        _N, 1.0, _NIC, "one transfer cannot tell its two ends apart"
    ),
    Rule.FROZEN_READY_NOT_SENT: Weight(
        _N, 1.5, _NIC, "Table 4 G>T, local cause; + share of its open sends"
    ),
    Rule.SENT_NOT_DONE_INTO: Weight(
        _N, 0.5, _NIC, "Table 4 T>D at the receiver; x (1 + share of flows)"
    ),
    Rule.NEVER_MOVED: Weight(_G, 2.0, _RANK, "Table 4 not started: kernel never ran"),
    Rule.UNCONSUMED_INPUT: Weight(
        _G, 1.0, _RANK, "Table 4 GPU not ready; + 4 x surplus + held share"
    ),
    Rule.MUTUAL_UNSTARTED: Weight(_G, 1.0, _RANK, "named equally: a tie"),
    Rule.NO_BUFFER_OFFERED: Weight(
        _G, 2.0, _RANK, "its kernel offers same-host buffers: it never ran"
    ),
    Rule.FIRST_TO_STOP: Weight(
        None, 0.75, _RANK, "on its leading component: the first stop is the cause"
    ),
    Rule.ORDER_CYCLE: Weight(_H, 2.5, _RANK, "the application's issue order"),
    Rule.COMM_ORDER_CYCLE: Weight(
        _H, 0.9, _RANK, "confidence, split over the ranks stuck out of order"
    ),
    Rule.PORT_DOWN: Weight(
        _N, PORT_SCORE, _NIC, "+ its data-path scores: this end failed"
    ),
    Rule.PORT_STAYED_UP: Weight(
        None, QUIET_SHARE, _RANK, "x its data-path scores: the far end's outage"
    ),
    Rule.PORT_FLAPPING: Weight(_N, PORT_SCORE, _NIC, "the link keeps retraining"),
    Rule.LINK_TD_LAG: Weight(
        Component.NETWORK, LINK_BASE, _LINK, "x (1 + log2(1 + flows))"
    ),
    Rule.NIC_TD_LAG: Weight(_N, LINK_BASE, _NIC, "x (1 + log2(1 + flows))"),
    Rule.PCIE_TD_LAG: Weight(_P, LINK_BASE, _RANK, "x (1 + log2(1 + flows))"),
    Rule.SWITCH_BACKLOG: Weight(
        Component.NETWORK, LINK_BASE, _LINK, "x (1 + log2(1 + flows))"
    ),
    Rule.NIC_SEND_BACKLOG: Weight(_N, LINK_BASE, _NIC, "x (1 + log2(1 + flows))"),
    Rule.PROXY_SEND_BACKLOG: Weight(
        Component.PROXY, LINK_BASE, _RANK, "x (1 + log2(1 + flows))"
    ),
    Rule.PROXY_FREEZE: Weight(
        Component.PROXY, LINK_BASE, _RANK, "the NIC verdict's score, on the proxy"
    ),
    Rule.NIC_RECEIVE_BACKLOG: Weight(_N, LINK_BASE, _NIC, "x (1 + log2(1 + flows))"),
    Rule.NIC_PCIE_BACKLOG: Weight(_P, LINK_BASE, _RANK, "x (1 + log2(1 + flows))"),
    Rule.PCIE_BACKLOG: Weight(_P, LINK_BASE, _RANK, "x (1 + log2(1 + flows))"),
    Rule.SLOW_TRANSFERS: Weight(
        _N, LINK_BASE, _NIC, "on the part's component; x (1 + log2(1 + pairs))"
    ),
    Rule.HOST_WIDE_LATE: Weight(
        _G, 1.5, _HOST, "one cause for a host; + lateness / span (at most 1)"
    ),
    Rule.SLOW_COMPUTE: Weight(
        _G, 1.5, _RANK, "its own compute; + lateness / span (at most 1)"
    ),
    Rule.LATE_ARRIVAL: Weight(_G, 1.0, _RANK, "+ lateness / span"),
    Rule.HOLDS_BACK: Weight(
        _G, 1.5, _RANK, "what the group lost to it; + that share of its time"
    ),
    Rule.READY_LAGS: Weight(_P, 1.0, _RANK, "copies late; + the ready deficit"),
    Rule.FINISHES_LAST: Weight(
        _P, 0.8, _RANK, "weaker alone; + 0.4 if gpu_ready lags, + lag / span"
    ),
    Rule.MISMATCH_MINORITY: Weight(
        Component.CONFIG, 0.95, _RANK, "confidence, split over the minority"
    ),
    Rule.EXPLAINED_AWAY: Weight(
        None, 0.5, _RANK, "x their flow scores: all symptoms at most this share"
    ),
}

FLOW_RULES = frozenset(
    {
        Rule.LINK_TD_LAG,
        Rule.NIC_TD_LAG,
        Rule.PCIE_TD_LAG,
        Rule.SWITCH_BACKLOG,
        Rule.NIC_SEND_BACKLOG,
        Rule.PROXY_SEND_BACKLOG,
        Rule.PROXY_FREEZE,
        Rule.NIC_RECEIVE_BACKLOG,
        Rule.NIC_PCIE_BACKLOG,
        Rule.PCIE_BACKLOG,
    }
)
"""Slowdown rules read from flow gaps (G-T, T-D). Gaps propagate: whatever
slows one part of a job whose ranks wait on each other backs up flows
elsewhere (a slow consumer backs up its producers, a stalled link every
flow queued behind it)."""

DIRECT_RULES = frozenset(
    {Rule.PORT_DOWN, Rule.PORT_FLAPPING, Rule.SLOW_COMPUTE, Rule.SLOW_TRANSFERS}
)
"""Slowdown rules measured at the part itself, which no fault elsewhere
produces: a port that went down, a GPU computing longer between its ops
than its on-time peers, transfers whose time on the wire grew (not their
waits before it). A suspect with one explains the flow gaps of every
suspect without one (``suspect.explain_away``)."""

# Counts and floors.

PEERS = 2
"""Fewest members a comparison among peers needs: values with an outlier,
a group's ranks, a host's or a NIC's GPUs, hosts, classes of ranks, the
stops of ranks, a top culprit and its runner-up."""

MAJORITY = 3
"""Fewest members among which one that differs is outvoted by the others (a
pair has no majority): hosts' clocks, hosts' span medians, the NICs a
congestion spreads over, a communicator's members in a mismatch."""

PROXY_FREEZE_EPISODES = 2
"""A NIC backlog whose T froze in at most this many long episodes is the send
proxy (a thread descheduled once or twice); a link that flaps freezes T
again and again."""

SHARE_RULES = frozenset(
    {
        Rule.PORT_STAYED_UP,
        Rule.EXPLAINED_AWAY,
        Rule.MISMATCH_MINORITY,
        Rule.COMM_ORDER_CYCLE,
    }
)
"""Rules whose weight is a share of other scores or a confidence: at most 1."""
