"""Name the part that failed: a NIC, a host or a link, not one of its ranks.

The root-cause rules score ranks. When the evidence points at something
ranks share, the published culprit is that thing: a NIC fault scores both
GPUs behind the NIC alike (a tie at half the confidence each), and an
operator replaces a NIC, not a GPU. :func:`scope_culprits` folds the scored
ranks into what they share, keeping the order of the strongest member:

* ``nic`` culprits fold into one per NIC (host, device), scope ``nic``:
  ``ranks`` every rank behind the NIC, confidence the members' sum (at most
  ``RcaConfig.max_confidence``);
* ``host`` culprits fold into one per host, scope ``host``: ``ranks`` every
  rank of the host, confidence as for a NIC, when the evidence is host-wide
  (two or more of the host's ranks scored ``host``, or the host has one
  rank); one rank's ``host`` evidence (its CPU side: never issued the op,
  issued late) stays scope ``rank``, so the answer names that rank;
* a ``network`` culprit with a flow is scope ``link``: the flow
  ``rank -> peer``, a path between two hosts with no single device;
* anything else is scope ``rank``: its GPU, PCIe path, proxy thread,
  process or config.

The representative ``rank``, its flow and reason are the strongest member's,
so whoever reads only ``rank`` sees what it saw before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from mycroft.schemas.records import Culprit
from mycroft.schemas.vocab import Component
from mycroft.streams.core.rca_config import DEFAULT_RCA
from mycroft.streams.core.topology import JobTopology


def scope_culprits(
    culprits: Sequence[Culprit],
    topo: JobTopology,
    max_confidence: float = DEFAULT_RCA.max_confidence,
) -> list[Culprit]:
    """Fold NIC and host culprits per device; mark link culprits (see module)."""
    out: list[Culprit] = []
    folded: dict[tuple[str, str, str], int] = {}  # (scope, host, device) -> index
    wide = _hostwide(culprits, topo)
    for c in culprits:
        key = _device(c, topo, wide)
        if key is None:
            scope = (
                "link"
                if c.component is Component.NETWORK and c.peer is not None
                else "rank"
            )
            out.append(replace(c, scope=scope))
            continue
        at = folded.get(key)
        if at is None:
            folded[key] = len(out)
            out.append(_as_device(c, key, topo))
            continue
        top = out[at]
        conf = min(max_confidence, top.confidence + c.confidence)
        out[at] = replace(top, confidence=round(conf, 3))
    return out


def _hostwide(culprits: Sequence[Culprit], topo: JobTopology) -> set[str]:
    """Hosts whose ``host`` evidence is host-wide: more than one of their
    ranks scored ``host``, or every rank they run did (a host of one rank)."""
    ranks: dict[str, set[int]] = {}
    for c in culprits:
        if c.component is Component.HOST:
            ranks.setdefault(topo.rank_host.get(c.rank, c.host), set()).add(c.rank)
    size: dict[str, int] = {}
    for h in topo.rank_host.values():
        size[h] = size.get(h, 0) + 1
    return {h for h, rs in ranks.items() if len(rs) > 1 or size.get(h, 1) == len(rs)}


def _device(
    c: Culprit, topo: JobTopology, hostwide: set[str]
) -> tuple[str, str, str] | None:
    """``(scope, host, device)`` that ``c`` folds into, or None (a rank)."""
    host = topo.rank_host.get(c.rank, c.host)
    if c.component is Component.NIC:
        nic = topo.rank_nic.get(c.rank, "")
        return ("nic", host, nic) if nic else None
    if c.component is Component.HOST and host in hostwide:
        return "host", host, host
    return None


def _as_device(c: Culprit, key: tuple[str, str, str], topo: JobTopology) -> Culprit:
    scope, host, device = key
    if scope == "nic":
        ranks = tuple(topo.ranks_on_nic(c.rank)) or (c.rank,)
    else:
        ranks = tuple(sorted(r for r, h in topo.rank_host.items() if h == host))
    return replace(c, scope=scope, device=device, ranks=ranks or (c.rank,))
