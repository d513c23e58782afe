"""The answer first: one headline per incident, and what to do next.

Every command that prints a root cause (``mycroft analyze``, ``mycroft
incidents show`` and ``follow``, the demo, the HTML report) leads with the
same headline: what happened, where (the rank, its GPU or NIC, and the
host), how sure in words with the number beside it, then the next step for
the component blamed, then the evidence with repeated lines once. This is
presentation only: the verdict is the core's (``streams/core``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mycroft.schemas.records import Culprit, RootCause
from mycroft.schemas.vocab import Component


@dataclass(frozen=True)
class Place:
    """Where a rank runs, as the job's topology records say."""

    host: str
    gpu: str = ""
    nic: str = ""


Placement = Callable[[int], Place | None]
"""Rank -> where it runs (None: the topology does not say)."""


def nowhere(_rank: int) -> Place | None:
    """A :data:`Placement` that knows nothing (no topology records)."""
    return None


CERTAINTY = ((0.85, "almost certain"), (0.6, "likely"), (0.0, "possible"))
"""Lowest confidence -> the words for it, highest first."""

CONFIDENCE_NOTE = (
    "Confidence is the culprit's share of the evidence score against every "
    "other suspect (at most 0.99), not a probability: almost certain from "
    "0.85, likely from 0.60, possible below. A low one means other suspects "
    "are close; a later revision may name another culprit."
)
"""The one-line explanation of the number, for the report page."""

_WHAT = {
    Component.GPU: "the GPU",
    Component.NIC: "the NIC",
    Component.NETWORK: "the network",
    Component.PCIE: "PCIe",
    Component.PROXY: "NCCL's proxy thread",
    Component.PROCESS: "the training process",
    Component.HOST: "the host",
    Component.CONFIG: "the job's code or configuration",
}

NEXT_STEP = {
    Component.GPU: "drain {host} and run the GPU diagnostics on {gpu} "
    "(dcgmi diag -r 3; nvidia-smi -q for Xid and ECC errors)",
    Component.NIC: "check {nic} on {host}: port link state and error counters "
    "(ibstat {nic_arg}, perfquery, ethtool -S); drain the node if the port flaps",
    Component.NETWORK: "check the fabric path {host} -> {peer_host}: switch port "
    "counters, congestion (PFC/ECN pauses), link flaps on that route",
    Component.PCIE: "check the PCIe link of {gpu} and {nic} on {host}: lspci -vv "
    "(link speed and width), AER errors in dmesg",
    Component.PROXY: "look at NCCL's proxy thread of rank {rank} on {host}: its "
    "stack (py-spy dump --native), CPU pinning and load",
    Component.PROCESS: "look at rank {rank}'s process on {host}: its stack "
    "(py-spy dump), a data-loader or checkpoint stall, an exit in its log",
    Component.HOST: "check host {host}: CPU and memory pressure, the kernel log "
    "(dmesg), throttling; drain it if it repeats",
    Component.CONFIG: "look at the job's code for a collective-order or size "
    "bug: ranks calling different collectives, or one with different sizes",
}
"""Component -> the next step an on-call engineer takes."""


def certainty(confidence: float) -> str:
    """``almost certain``, ``likely`` or ``possible``."""
    return next(words for low, words in CERTAINTY if confidence >= low)


def _rank_place(rank: int, host: str, placement: Placement) -> str:
    place = placement(rank)
    on = place.host if place is not None and place.host else host
    gpu = f" (GPU {place.gpu})" if place is not None and place.gpu else ""
    return f"rank {rank}{gpu} on host {on}"


def where(c: Culprit, placement: Placement = nowhere) -> str:
    """The culprit's place in words: ``rank 5 (GPU gpu1) on host node-1``,
    ``NIC mlx5_1 of host node-1 (ranks 4, 5)``, ``link 5 -> 9, channel 2
    (node-1 -> node-2)``."""
    if c.scope == "nic" and c.device:
        subject: str = c.subject()
        return subject.replace(" of ", " of host ", 1)
    if c.scope == "link" and c.peer is not None:
        peer = placement(c.peer)
        to = f" -> {peer.host}" if peer is not None and peer.host else ""
        ch = "" if c.channel is None else f", channel {c.channel}"
        return f"link {c.rank} -> {c.peer}{ch} ({c.host}{to})"
    text = _rank_place(c.rank, c.host, placement)
    if c.scope == "host" and len(c.ranks) > 1:
        text += f", blamed for the whole host ({c.subject().split('(', 1)[1]}"
    return text


def headline(rc: RootCause, placement: Placement = nowhere) -> str:
    """``hang at rank 5 (GPU gpu1) on host node-1: the GPU, likely (0.62)``."""
    if not rc.culprits:
        return f"{rc.kind.value}: no culprit named"
    c = rc.culprits[0]
    return (
        f"{rc.kind.value} at {where(c, placement)}: {_WHAT[c.component]}, "
        f"{certainty(c.confidence)} ({c.confidence:.2f})"
    )


def next_step(c: Culprit, placement: Placement = nowhere) -> str:
    """What to do about culprit ``c``, filled in with its host, GPU and NIC."""
    place = placement(c.rank) or Place(c.host)
    peer = placement(c.peer) if c.peer is not None else None
    nic = c.device if c.scope == "nic" and c.device else place.nic
    return NEXT_STEP[c.component].format(
        host=place.host or c.host or "its host",
        gpu=place.gpu or f"rank {c.rank}'s GPU",
        nic=f"NIC {nic}" if nic else f"rank {c.rank}'s NIC",
        nic_arg=nic or "<nic>",
        peer_host=(peer.host if peer is not None else "") or "the peer's host",
        rank=c.rank,
    )


def short_id(incident_id: str) -> str:
    """Eight hex digits standing for an incident id (60 characters and more):
    what the report shows, and what ``mycroft incidents show`` takes."""
    return hashlib.sha1(incident_id.encode()).hexdigest()[:8]  # noqa: S324 - a name, not a secret


def unique(lines: Iterable[str]) -> list[str]:
    """``lines`` in order, each identical line once."""
    return list(dict.fromkeys(lines))


def verdict_lines(
    rc: RootCause, placement: Placement = nowhere, max_evidence: int | None = None
) -> list[str]:
    """Headline, next step, why, then the evidence (each line once)."""
    lines = [headline(rc, placement)]
    if rc.culprits:
        best = rc.culprits[0]
        lines.append(f"  next step: {next_step(best, placement)}")
        if best.reason:
            lines.append(f"  why: {best.reason}")
    facts = unique(e.fact for e in rc.evidence)
    shown = facts if max_evidence is None else facts[:max_evidence]
    lines += [f"    - {fact}" for fact in shown]
    if len(shown) < len(facts):
        lines.append(f"    ({len(facts) - len(shown)} more evidence lines)")
    return lines


def folded(lines: list[str], first: int = 3, verbose: bool = False) -> list[str]:
    """``lines``, or the first few and how many more (``verbose``: all)."""
    if verbose or len(lines) <= first + 1:
        return lines
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
    more = f"{indent}... and {len(lines) - first} more (--verbose: all)"
    return [*lines[:first], more]
