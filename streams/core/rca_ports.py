"""Which end of a link went down: NIC port events as root-cause evidence.

Flow counters blame a link, and when one NIC pair carries every stalled
transfer (a pipeline send/recv between two hosts) they blame both ends: the
sender's sends freeze ready but untransmitted, the receiver moves nothing.
A port that went down, or flapped, is the end at fault. When some
data-path suspects' ports went down and others' stayed up, the first get
``PORT_SCORE`` on nic (rule ``PORT_DOWN``), plus their other data-path
scores (a dead port explains backed-up sends and a starved GPU alike), and
the second keep ``QUIET_SHARE`` of their data-path scores (rule
``PORT_STAYED_UP``): their stall is what a dead far end looks like from a
healthy one (both constants in ``scoring.py``). Only ranks already
suspected for a data-path component (nic, proxy, network, pcie: blamed from
flow counters) are considered, and, in a hang, the far ends of their open
cross-host flows (``nominate_far_ends``): a port event with flows that do
not stall is not a cause.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mycroft.schemas.vocab import Component
from mycroft.streams.core.detect_ports import nic_ranks
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.ports import PortEvents
from mycroft.streams.core.suspect import Suspects

if TYPE_CHECKING:  # rca_hang and rca_slow call in here
    from mycroft.streams.core.detect import DetectContext

DATA_PATH = (Component.NIC, Component.PROXY, Component.NETWORK, Component.PCIE)
"""Components blamed from flow counters: a port that went down explains
their stalls (flows into a GPU back up behind its dead NIC as behind a
slow PCIe link)."""

PORT_LEAD_NS = 5_000_000_000
"""Port events this long before the incident's onset still count: a port
reads down in the first heartbeat after it went (1 s), and a link that goes
down shortly before the first slow op is the usual order."""


def score_port_events(ctx: DetectContext, suspects: Suspects, since_ns: int) -> None:
    """Move link blame to the suspects whose NIC port went down or flapped
    since ``since_ns - PORT_LEAD_NS`` (nothing changes when none did)."""
    events: dict[int, PortEvents] = {}
    for r in sorted(suspects):
        if any(c in suspects[r].scores for c in DATA_PATH):
            host, nic = ctx.topo.nic_key(r)
            events[r] = ctx.store.ports.events(host, nic, since_ns - PORT_LEAD_NS)
    down = sorted(r for r, ev in events.items() if ev)
    if not down:
        return
    for r, ev in events.items():
        sus = suspects[r]
        host, nic = ctx.topo.nic_key(r)
        if ev:  # the decisive evidence: stated first
            sus.fold(
                Rule.PORT_DOWN,
                DATA_PATH,
                f"port of {nic} on {host} {_what(ev)} since the incident began "
                "(link_downed / port state): this end of the link failed",
            )
            continue
        sus.scale(
            Rule.PORT_STAYED_UP,
            DATA_PATH,
            f"its port ({nic} on {host}) stayed up while rank {down[0]}'s went "
            "down: its stalled flows are the far end's outage",
        )


def nominate_flapping_ports(
    ctx: DetectContext, suspects: Suspects, since_ns: int
) -> None:
    """Suspect the NIC of each rank behind a port that kept going down since
    ``since_ns - PORT_LEAD_NS`` (``detect_ports``' rule), so that port
    evidence can name a culprit that flow counters never flagged."""
    cfg = ctx.cfg
    window_ns = int(cfg.port_flap_window_s * 1e9)
    for host, nic, start_ns, beats in ctx.store.ports.flapping(
        ctx.store.ports.newest_ns(), window_ns, cfg.port_flap_need
    ):
        if start_ns < since_ns - PORT_LEAD_NS - window_ns:
            continue
        for r in nic_ranks(ctx, host, nic):
            sus = suspects.at(r)
            if not any(c in sus.scores for c in DATA_PATH):
                sus.add(
                    Rule.PORT_FLAPPING,
                    f"a port of {nic} on {host} went down in {beats} recent "
                    "heartbeats: the link keeps retraining",
                )


def port_failed(ctx: DetectContext, rank: int, since_ns: int) -> bool:
    """Whether ``rank``'s NIC port went down or flapped since
    ``since_ns - PORT_LEAD_NS`` (False when its NIC is not known)."""
    host, nic = ctx.topo.nic_key(rank)
    return bool(nic) and bool(
        ctx.store.ports.events(host, nic, since_ns - PORT_LEAD_NS)
    )


def _what(ev: PortEvents) -> str:
    if not ev.downs:
        return "was seen down"
    times = f"went down {ev.downs} time{'s' if ev.downs > 1 else ''}"
    return times + (" and was seen down" if ev.seen_down else "")


def nominate_far_ends(
    ctx: DetectContext, suspects: Suspects, flows: np.ndarray, since_ns: int
) -> None:
    """Make the suspects of a hang and the cross-host peers of their open
    flows (``flows``: the latest flow rows) NIC candidates when their port
    went down: a dead NIC stops a flow at either end, and under credits its
    sender shows only T > D, which no rule blames on the sender's NIC; the
    port, read at the failed end, is what tells the two ends apart."""
    topo = ctx.topo
    open_ = flows[
        np.isin(flows["rank"], list(suspects)) & (flows["done"] < flows["total"])
    ]
    ends = set(suspects)
    for rank, peer in zip(open_["rank"].tolist(), open_["peer"].tolist(), strict=True):
        if topo.host_of(peer) != topo.host_of(rank):
            ends.add(peer)
    for rank in sorted(ends):
        sus = suspects.get(rank)
        if sus is not None and any(c in sus.scores for c in DATA_PATH):
            continue
        host, nic = topo.nic_key(rank)
        if ctx.store.ports.events(host, nic, since_ns - PORT_LEAD_NS):
            suspects.at(rank).consider(Component.NIC)
