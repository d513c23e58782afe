"""Stage 2 of the two-stage worker: one root cause per incident from comm summaries.

A ``JobResolver`` keeps, per job, the topology and the latest
:class:`CommSummary` of every comm group. Its detectors are the stage-1
summaries (new anomalies, ids still firing); incidents, revisions and dedup
are the single-stage :class:`~mycroft.streams.core.engine.Analyzer`'s, which
it extends, so the anomaly and root-cause topics see the same semantics.

Hang resolution follows propagation across comm groups: a stalled
communicator's local culprit that is itself stuck in another stalled
communicator (the op it issued first; GPU stream order) hands the blame on
to that communicator, e.g. a PP stall whose culprit "never issued" its send
because it is stuck in a hung DP or TP op. The sink communicators of that
graph hold the root cause; a cycle over >= 2 communicators is an order
deadlock and blames the ranks stuck in the minority communicator.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from mycroft.schemas.records import (
    Anomaly,
    BlockState,
    CommStatus,
    CommSummary,
    Culprit,
    Evidence,
    Record,
    Topology,
)
from mycroft.schemas.text import comm_hex
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.event_time import STALE_GROUP_NS
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.graph import terminal_groups
from mycroft.streams.core.incidents import Finding, Incident, IncidentTracker
from mycroft.streams.core.rca_config import DEFAULT_RCA, RcaConfig
from mycroft.streams.core.scoring import PEERS
from mycroft.streams.core.topology import JobTopology

FOLLOW_SHARE = 0.5
"""Culprits of a comm within this share of its top confidence are followed."""
_KNOWN_IDS = 4096
SETTLE_CAP = 5
"""The first root cause waits at most this many ``settle_s`` for lagging groups."""


@dataclass(frozen=True)
class _Stuck:
    """Where a rank is stuck: the stalled comm whose op it issued first."""

    comm: int
    seq: int
    issue_ns: int


def stuck_ranks(statuses: Iterable[CommStatus]) -> dict[int, _Stuck]:
    """Rank -> the stalled comm it is stuck in (earliest-issued op it is in).

    An unknown issue time (0) sorts last: any known earlier op wins.
    """
    out: dict[int, _Stuck] = {}
    for st in statuses:
        for b in st.blocked:
            if b.state is not BlockState.IN_OP:
                continue
            here = _Stuck(st.comm, b.seq, b.issue_ns or 2**63 - 1)
            prev = out.get(b.rank)
            if prev is None or (here.issue_ns, here.comm) < (prev.issue_ns, prev.comm):
                out[b.rank] = here
    return out


def _followed(st: CommStatus) -> list[Culprit]:
    if not st.culprits:
        return []
    top = st.culprits[0].confidence
    return [c for c in st.culprits if c.confidence >= FOLLOW_SHARE * top][:3]


def comm_wait_graph(
    statuses: Sequence[CommStatus], stuck: dict[int, _Stuck]
) -> nx.DiGraph:
    """Comm -> comm edges: a culprit of the first is stuck in the second."""
    g: nx.DiGraph = nx.DiGraph()
    for st in statuses:
        g.add_node(st.comm)
        for c in _followed(st):
            where = stuck.get(c.rank)
            if where is not None and where.comm != st.comm:
                g.add_edge(st.comm, where.comm, rank=c.rank, seq=where.seq)
    return g


def resolve_hang(
    statuses: Sequence[CommStatus],
    symptom_comms: set[int],
    rca: RcaConfig = DEFAULT_RCA,
) -> tuple[list[Culprit], list[Evidence]]:
    """Culprits (best first) and evidence of a hang from stalled-comm statuses.

    Args:
        statuses: The latest HANG statuses of every comm group of the job.
        symptom_comms: Comms named by the incident's anomalies (all stalled
            comms when none of them has a status).
        rca: The caps and the order-deadlock weight.
    """
    by_comm = {st.comm: st for st in statuses}
    if not by_comm:
        return [], []
    stuck = stuck_ranks(statuses)
    g = comm_wait_graph(list(by_comm.values()), stuck)
    start = (symptom_comms & set(by_comm)) or set(by_comm)
    sinks = terminal_groups(g, start)
    reach = {comm: nx.descendants(g, comm) | {comm} for comm in start}
    weight = Counter[int]()
    for i, sink in enumerate(sinks):
        weight[i] = sum(1 for r in reach.values() if r & sink)
    scored: dict[tuple[object, ...], tuple[float, Culprit]] = {}
    evidence: list[Evidence] = []
    for i, sink in enumerate(sinks):
        share = weight[i] / max(sum(weight.values()), 1)
        for c in _sink_culprits(sink, by_comm, stuck, rca):
            key = (c.rank, c.component, c.peer, c.channel)
            score = c.confidence * share
            if key not in scored or score > scored[key][0]:
                scored[key] = (score, c)
        evidence.extend(_chain(g, start, sink, by_comm))
    total = sum(sc for sc, _ in scored.values()) or 1.0
    ranked = sorted(scored.values(), key=lambda x: (-x[0], x[1].rank))
    culprits = [
        replace(c, confidence=round(min(rca.max_confidence, sc / total), 3))
        for sc, c in ranked[: rca.max_culprits]
    ]
    return culprits, evidence


def _sink_culprits(
    sink: set[int],
    by_comm: dict[int, CommStatus],
    stuck: dict[int, _Stuck],
    rca: RcaConfig,
) -> list[Culprit]:
    if len(sink) > 1:
        order = _order_deadlock(sink, by_comm, stuck, rca)
        if order:
            return order
    return [c for comm in sorted(sink) for c in by_comm[comm].culprits]


def _order_deadlock(
    sink: set[int],
    by_comm: dict[int, CommStatus],
    stuck: dict[int, _Stuck],
    rca: RcaConfig,
) -> list[Culprit]:
    """Comms waiting on each other: blame the ranks stuck in the minority comm."""
    classes: dict[int, list[int]] = {}
    for comm in sink:
        for b in by_comm[comm].blocked:
            where = stuck.get(b.rank)
            if where is not None and where.comm in sink:
                ranks = classes.setdefault(where.comm, [])
                if b.rank not in ranks:
                    ranks.append(b.rank)
    if len(classes) < PEERS:
        return []
    sizes = sorted(len(v) for v in classes.values())
    if sizes[0] == sizes[-1]:
        return []  # no majority order: name nobody
    major = max(classes, key=lambda c: (len(classes[c]), c))
    hosts = {c.rank: c.host for st in by_comm.values() for c in st.culprits}
    out: list[Culprit] = []
    for comm, ranks in sorted(classes.items()):
        if comm == major:
            continue
        out.extend(
            Culprit(
                rank=r,
                host=hosts.get(r, ""),
                component=Component.HOST,
                kind=FaultKind.HANG,
                confidence=rca.weight(Rule.COMM_ORDER_CYCLE) / len(ranks),
                reason=f"order deadlock: rank {r} is stuck in comm {comm_hex(comm)} "
                f"while ranks {sorted(classes[major])[:8]} are stuck in comm "
                f"{comm_hex(major)}; each waits in an op the other side never issued",
                rules=(Rule.COMM_ORDER_CYCLE.value,),
            )
            for r in sorted(ranks)
        )
    return out


def _chain(
    g: nx.DiGraph, start: set[int], sink: set[int], by_comm: dict[int, CommStatus]
) -> list[Evidence]:
    out: list[Evidence] = []
    for src in sorted(start):
        target = next((t for t in sorted(sink) if nx.has_path(g, src, t)), None)
        if target is None:
            continue
        path = nx.shortest_path(g, src, target)
        for u, v in zip(path, path[1:], strict=False):
            e = g.edges[u, v]
            out.append(
                Evidence(
                    f"comm {comm_hex(u)} waits on rank {e['rank']}, which is stuck in "
                    f"comm {comm_hex(v)} seq {e['seq']}",
                    e["rank"],
                    u,
                    by_comm[u].frontier_seq,
                )
            )
        break
    for comm in sorted(sink):
        out.extend(by_comm[comm].evidence)
    return out


LINK = (Component.NIC, Component.NETWORK, Component.PROXY)
"""Components only flow counters (G/T/D) can show."""


def merge_culprits(
    statuses: Iterable[CommStatus], topo: JobTopology | None = None
) -> list[Culprit]:
    """Culprits over several groups' local views: confidence averaged over the
    views that name anyone (a suspect seen by one group of two gets half), so
    evidence found in several groups adds up, as in one job-wide table.

    G/T/D first, as within one view: a group that holds a rank's network
    flows may blame its link (nic, network, proxy), while a group without
    them sees the same rank, or its NIC mate, only arrive late and blames the
    gpu. That timing verdict is the link fault's symptom; its confidence
    joins the link verdict (with ``topo``, NIC mates count as the rank).
    """
    views = [st.culprits for st in statuses if st.culprits]
    total: dict[tuple[int, Component], float] = {}
    first: dict[tuple[int, Component], Culprit] = {}
    for culprits in views:
        for c in culprits:
            key = (c.rank, c.component)
            total[key] = total.get(key, 0.0) + c.confidence
            first.setdefault(key, c)
    _gtd_first(total, topo)
    merged = [
        replace(first[k], confidence=round(v / len(views), 3)) for k, v in total.items()
    ]
    return sorted(merged, key=lambda c: (-c.confidence, c.rank))


def _gtd_first(
    total: dict[tuple[int, Component], float], topo: JobTopology | None
) -> None:
    """Move each gpu verdict onto the strongest link verdict of its rank or
    a NIC mate, in place."""
    links = {k: v for k, v in total.items() if k[1] in LINK}
    if not links:
        return
    for rank, comp in [k for k in total if k[1] is Component.GPU]:
        near = set(topo.ranks_on_nic(rank)) if topo and topo.host_of(rank) else set()
        near.add(rank)
        mine = [k for k in links if k[0] in near]
        if mine:
            best = max(mine, key=lambda k: (links[k], -k[0]))
            total[best] += total.pop((rank, comp))


class JobResolver:
    """Stage 2: incidents and root causes of one job from its comm summaries.

    Args:
        job_id: The job.
        config: Thresholds (``incident_quiet_s`` is used here).
        stale_s: A group not heard from for this long (this resolver's
            clock; default :data:`~.event_time.STALE_GROUP_NS`) no longer
            keeps anomalies active nor contributes statuses.
            Until then its latest summary stands: a stage-1 worker behind
            its input sends summaries in bursts, and an incident must not
            close for want of them.
        settle_s: The first root cause of an incident waits until every
            group has read its input up to the first anomaly's detection:
            groups are consumed independently and one may lag. A group silent for
            ``settle_s`` is not waited for, nor is anyone after
            ``SETTLE_CAP`` x ``settle_s``.

    ``ingest`` takes ``CommSummary`` and ``Topology`` records; ``evaluate``
    returns new anomalies and root-cause revisions exactly like ``Analyzer``:
    the same :class:`~.incidents.IncidentTracker`, with this resolver's
    explainer (:meth:`explain`).
    """

    def __init__(
        self,
        job_id: str,
        config: DetectorConfig | None = None,
        stale_s: float = STALE_GROUP_NS / 1e9,
        settle_s: float = 2.0,
    ) -> None:
        self.job_id = job_id
        self.cfg = config or DetectorConfig()
        self.topo = JobTopology()
        self.incidents = IncidentTracker(job_id, self.cfg, self.topo)
        self.stale_ns = int(stale_s * 1e9)
        self.settle_ns = int(settle_s * 1e9)
        self.latest: dict[int, CommSummary] = {}
        self.heard: dict[int, int] = {}  # group -> now_ns of its latest summary
        self.read_at: dict[str, int] = {}  # anomaly id -> data_ns that brought it
        self.known: OrderedDict[str, Anomaly] = OrderedDict()
        self._new: list[Anomaly] = []
        self.explained: tuple[str, int] = ("", 0)  # incident, groups up to date

    def ingest(self, record: Record, now_ns: int) -> None:
        """Fold a summary or a topology record in; other records are ignored."""
        if isinstance(record, Topology):
            self.topo.add(record)
            return
        if not isinstance(record, CommSummary):
            return
        # Arrival order, not tick order: a group's summaries come in order from
        # one partition, while a stage-1 clock may step back (its trace clock
        # extrapolates on wall time until the group's first rows arrive).
        self.latest[record.group] = record
        self.heard[record.group] = now_ns
        for a in record.anomalies:
            if a.anomaly_id not in self.known:
                self.known[a.anomaly_id] = a
                self.read_at[a.anomaly_id] = record.data_ns
                self._new.append(a)
        while len(self.known) > _KNOWN_IDS:
            self.read_at.pop(self.known.popitem(last=False)[0], None)

    @property
    def incident(self) -> Incident | None:
        """The open incident, if any."""
        return self.incidents.incident

    def evaluate(self, now_ns: int) -> list[Finding]:
        """New anomalies, then a root-cause revision of the incident, if any.

        An answered incident is explained again at once, whatever its refresh
        period, when more groups are up to date than its last answer had: the
        summaries of a stage-1 worker far behind its input come late (after
        the answer, or after the job's last tick), and the answer must be the
        one their evidence gives, not the one given without them.
        """
        inc = self.incident
        refresh = (
            inc is not None
            and inc.revision >= 0
            and self.explained[0] == inc.incident_id
            and self.caught_up(inc)[0] > self.explained[1]
        )
        return self.incidents.track(
            self.detect(now_ns), now_ns, self.explain, refresh=refresh
        )

    def fresh(self, now_ns: int) -> list[CommSummary]:
        """The latest summary of every group heard from within ``stale_s``."""
        return [
            s
            for g, s in self.latest.items()
            if now_ns - self.heard.get(g, now_ns) <= self.stale_ns
        ]

    def detect(self, now_ns: int) -> list[Anomaly]:
        """New anomalies plus those the groups still report as firing."""
        seen = {a.anomaly_id for a in self._new}
        active = {i for s in self.fresh(now_ns) for i in s.active} - seen
        found = self._new + [self.known[i] for i in sorted(active) if i in self.known]
        self._new = []
        return found

    def caught_up(self, inc: Incident) -> tuple[int, int]:
        """``(groups read up to the incident's first detection, groups)``.

        Compared on ``data_ns`` (host ticks read), not ``tick_ns``: a lagging
        stage-1 worker's clock runs on while its input is behind.
        """
        groups = max((s.groups for s in self.latest.values()), default=0)
        first = min(self.read_at.get(i, 0) for i in inc.anomalies)
        done = sum(1 for s in self.latest.values() if s.data_ns >= first)
        return done, max(groups, done)

    def settled(self, inc: Incident, now_ns: int) -> bool:
        """Whether the first root cause of ``inc`` may be resolved now.

        Every group has read its input up to the incident's first detection,
        or the groups still behind were not heard from for ``settle_s``, or
        the incident waited ``SETTLE_CAP`` x ``settle_s``.
        """
        waited = now_ns - inc.detected_ns
        if inc.revision >= 0 or waited >= SETTLE_CAP * self.settle_ns:
            return True
        done, groups = self.caught_up(inc)
        if done == groups:
            return True
        if len(self.latest) < groups:
            return waited >= self.settle_ns  # a group has not reported at all
        first = min(self.read_at.get(i, 0) for i in inc.anomalies)
        return all(
            s.data_ns >= first or now_ns - self.heard[g] >= self.settle_ns
            for g, s in self.latest.items()
        )

    def explain(
        self, inc: Incident, kind: FaultKind, now_ns: int
    ) -> tuple[list[Culprit], list[Evidence]]:
        """The stage-2 explainer (:data:`~.incidents.Explainer`): from the
        comm groups' statuses, once the groups caught up (:meth:`settled`)."""
        if not self.settled(inc, now_ns):
            return [], []  # no root cause yet: retried at the next evaluate
        statuses = [st for s in self.fresh(now_ns) for st in s.comms if st.kind is kind]
        anomalies = list(inc.anomalies.values())
        done, groups = self.caught_up(inc)
        self.explained = (inc.incident_id, done)
        if kind is FaultKind.HANG:
            symptom = {c for a in anomalies for c in a.comms}
            culprits, evidence = resolve_hang(statuses, symptom, self.cfg.rca)
        else:
            culprits = merge_culprits(statuses, self.topo)[: self.cfg.rca.max_culprits]
            evidence = [e for st in statuses for e in st.evidence]
        if done < groups:
            # Resolved without some groups' evidence: say so, and leave room
            # for a more confident revision once they catch up.
            share = done / groups
            culprits = [
                replace(c, confidence=round(c.confidence * share, 3)) for c in culprits
            ]
            evidence.append(
                Evidence(f"resolved with {done} of {groups} comm groups up to date")
            )
        return culprits, evidence


__all__ = [
    "JobResolver",
    "comm_wait_graph",
    "merge_culprits",
    "resolve_hang",
    "stuck_ranks",
]
