"""One pass over a job's raw records: what an incident's figures plot.

:class:`Collector` takes the records of the incident's job (state and
completion batches, topology) in any order a trace or a topic gives them and
keeps only the incident's window (:func:`window_of`). What it plots comes
from those records and the root cause and anomaly records; nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from mycroft.report.anomaly_values import Fired, fired_of
from mycroft.report.series import Cumulative, binned_rate, flow_ranks
from mycroft.schemas.records import (
    Anomaly,
    CompletionBatch,
    Culprit,
    Record,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.schemas.vocab import RECV, SEND
from mycroft.verdict import Place

BIN_NS = 200_000_000
"""Heatmap resolution: two agent ticks."""
BEFORE_NS = 4_000_000_000
"""Seconds of healthy progress shown before the onset."""
AFTER_NS = 2_000_000_000
"""Shown after the root cause."""
MAX_PANELS = 4
"""Baseline panels: the cited anomalies' (detector, comm) pairs, best first."""


@dataclass(frozen=True)
class Window:
    """The span of trace time a report shows."""

    start_ns: int
    end_ns: int

    def edges(self) -> np.ndarray:
        """Bin edges of the heatmap."""
        return np.arange(self.start_ns, self.end_ns + 1, BIN_NS, dtype=np.int64)


def window_of(rc: RootCause) -> Window:
    """From 4 s before the onset to 2 s after the root cause."""
    return Window(
        rc.onset_ns - BEFORE_NS, max(rc.resolved_ns, rc.detected_ns) + AFTER_NS
    )


@dataclass(frozen=True)
class FlowSeries:
    """Cumulative G/T/D chunks of the culprit's flows: ``key`` 0 and 1 are
    the two directions of ``labels`` (a link's ends, a rank's sends and
    receives)."""

    labels: tuple[str, str]
    t_ns: np.ndarray
    key: np.ndarray
    gtd: np.ndarray  # (n, 3): gpu_ready, transmitted, done


@dataclass(frozen=True)
class BaselinePanel:
    """One fired baseline: the metric over time, from the records."""

    fired: Fired
    t_ns: np.ndarray
    value_s: np.ndarray
    hit: np.ndarray  # which samples are the ops the anomalies name


@dataclass(frozen=True)
class IncidentData:
    """Everything an incident's figures show."""

    rc: RootCause
    window: Window
    ranks: np.ndarray
    progress: np.ndarray  # (ranks, bins): chunks moved, NaN: no report
    flow: FlowSeries
    panels: list[BaselinePanel]
    fired: list[Fired]
    hosts: dict[int, str] = field(default_factory=dict)
    places: dict[int, Place] = field(default_factory=dict)  # rank -> host, GPU, NIC


@dataclass(frozen=True)
class FlowPick:
    """Which flows each direction of the culprit's series counts."""

    rank: tuple[int, int]  # reporting rank of key 0 and key 1
    peer: tuple[int | None, int | None]
    direction: tuple[int, int]
    channel: int | None
    labels: tuple[str, str]

    def keys(self, rank: np.ndarray, flow: np.ndarray) -> np.ndarray:
        """Per flow row: 0 or 1 (the key it counts for), -1 (neither)."""
        out = np.full(len(flow), -1, np.int64)
        for k in (1, 0):
            m = (rank == self.rank[k]) & (flow["dir"] == self.direction[k])
            if self.peer[k] is not None:
                m &= flow["peer"] == self.peer[k]
            if self.channel is not None:
                m &= flow["channel"] == self.channel
            out[m] = k
        return out


def flow_pick(c: Culprit | None) -> FlowPick | None:
    """A link or NIC culprit's flow ``rank -> peer`` both ways, else the
    culprit rank's sends and receives."""
    if c is None:
        return None
    if c.peer is None:
        return FlowPick(
            (c.rank, c.rank), (None, None), (SEND, RECV), None,
            (f"sends of rank {c.rank}", f"receives of rank {c.rank}"),
        )  # fmt: skip
    ch = "" if c.channel is None else f", channel {c.channel}"
    return FlowPick(
        (c.rank, c.peer), (c.peer, c.rank), (SEND, SEND), c.channel,
        (f"{c.rank} -> {c.peer}{ch}", f"{c.peer} -> {c.rank}{ch}"),
    )  # fmt: skip


class Collector:
    """Feed records of the incident's job; :meth:`result` is the figures' data."""

    def __init__(self, rc: RootCause, anomalies: Iterable[Anomaly]) -> None:
        self.rc = rc
        self.window = window_of(rc)
        cited = set(rc.anomaly_ids)
        self.fired = fired_of([a for a in anomalies if a.anomaly_id in cited])
        self.pick = flow_pick(rc.culprits[0] if rc.culprits else None)
        lo, hi = self.window.start_ns - BIN_NS, self.window.end_ns
        self.progress = Cumulative(1, lo, hi)
        self.flow = Cumulative(3, lo, hi)
        # A flow-lag anomaly's baseline pools every flow of a role: the table
        # lists it, no panel draws it.
        self.panels = [f for f in self.fired if f.unit == "s"][:MAX_PANELS]
        self._ops: dict[int, list[np.ndarray]] = {p.comm: [] for p in self.panels}
        comms = {p.comm for p in self.panels}
        self._last: dict[int, int] = dict.fromkeys(comms, 0)
        self._moved: dict[int, list[np.ndarray]] = {c: [] for c in comms}
        self._busy: dict[int, list[int]] = {
            p.comm: [] for p in self.panels if p.detector == "hang"
        }
        self.ranks: set[int] = set()
        self.hosts: dict[int, str] = {}
        self.places: dict[int, Place] = {}

    def add(self, record: Record) -> None:
        """Take one record (others than the job's raw records are ignored)."""
        if isinstance(record, Topology):
            if record.job_id == self.rc.job_id:
                for r in record.ranks:
                    self.ranks.add(r.rank)
                    self.hosts[r.rank] = record.host
                    self.places[r.rank] = Place(record.host, r.gpu, r.nic)
            return
        if not isinstance(record, StateBatch | CompletionBatch):
            return
        head = record.header
        if head.job_id != self.rc.job_id:
            return
        rank = flow_ranks(record.op)
        if isinstance(record, StateBatch):
            present = np.unique(record.rc["rank"]).astype(np.int64)
            self.ranks.update(present.tolist())
            done = record.flow["done"].astype(np.int64)[:, None]
            self.progress.state(head.tick_ns, present, rank, done)
            if self.pick is not None:
                k = self.pick.keys(rank, record.flow)
                owners = np.flatnonzero(np.isin(self.pick.rank, present))
                gtd = np.stack(
                    [
                        record.flow[c][k >= 0]
                        for c in ("gpu_ready", "transmitted", "done")
                    ],
                    axis=1,
                ).astype(np.int64)
                self.flow.state(head.tick_ns, owners, k[k >= 0], gtd)
            self._stalls(record, head.tick_ns)
        else:
            chunks = record.flow["chunks"].astype(np.int64)[:, None]
            self.progress.completion(head.tick_ns, rank, chunks)
            if self.pick is not None:
                k = self.pick.keys(rank, record.flow)
                gtd = np.repeat(chunks[k >= 0], 3, 1)
                self.flow.completion(head.tick_ns, k[k >= 0], gtd)
            self._completed(record)

    def _progressed(self, comm: int, times: np.ndarray) -> None:
        """Progress times of ``comm``: the last before the window, those in it."""
        if not len(times):
            return
        early = times < self.window.start_ns
        if early.any():
            self._last[comm] = max(self._last[comm], int(times[early].max()))
        late = times[~early & (times <= self.window.end_ns)]
        if len(late):
            self._moved[comm].append(late.astype(np.int64))

    def _stalls(self, batch: StateBatch, tick: int) -> None:
        """Per hang panel's comm: its flows' progress, and the ticks it is busy."""
        op = batch.op
        comm_of_flow = np.repeat(op["comm"], np.maximum(op["nflows"], 0))
        inside = self.window.start_ns <= tick <= self.window.end_ns
        for comm, busy in self._busy.items():
            if not (op["comm"] == comm).any():
                continue  # no member of the comm on this host, or idle
            last = batch.flow["last_ns"][comm_of_flow == comm]
            self._progressed(comm, last[last > 0])
            if inside:
                busy.append(tick)

    def _completed(self, batch: CompletionBatch) -> None:
        op = batch.op
        for comm, rows in self._ops.items():
            mine = op[op["comm"] == comm]
            if len(mine):
                self._progressed(comm, mine["end_ns"])
                shown = mine["end_ns"] >= self.window.start_ns
                shown &= mine["end_ns"] <= self.window.end_ns
                if shown.any():
                    rows.append(mine[shown])

    def _stall_of(self, comm: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tick, seconds since the comm's last progress)`` at each busy tick."""
        t = np.sort(np.array(self._busy[comm], np.int64))
        moved = np.sort(np.concatenate([np.array([self._last[comm]], np.int64),
                                        *self._moved[comm]]))  # fmt: skip
        last = moved[np.maximum(np.searchsorted(moved, t, side="right") - 1, 0)]
        known = (last > 0) & (last <= t)
        return t[known], (t[known] - last[known]) / 1e9

    def result(self) -> IncidentData:
        """The figures' data once every record was added."""
        edges = self.window.edges()
        t, key, value = self.progress.samples()
        ranks = np.array(sorted(self.ranks), np.int64)
        rate = binned_rate(
            t, key, value, int(ranks.max()) + 1 if len(ranks) else 0, edges
        )
        ft, fk, fv = self.flow.samples()
        labels = self.pick.labels if self.pick else ("no culprit", "")
        flow = FlowSeries(labels, ft, fk, fv)
        panels = [self._panel(f) for f in self.panels]
        return IncidentData(
            self.rc,
            self.window,
            ranks,
            rate[ranks] if len(ranks) else rate,
            flow,
            [p for p in panels if len(p.t_ns)],
            self.fired,
            self.hosts,
            self.places,
        )

    def _panel(self, f: Fired) -> BaselinePanel:
        if f.detector == "hang":
            t, v = self._stall_of(f.comm)
            return BaselinePanel(f, t, v, v > f.baseline)
        rows = self._ops[f.comm]
        if not rows:
            return BaselinePanel(f, *(np.zeros(0),) * 2, np.zeros(0, bool))
        ops = np.concatenate(rows)
        if f.op_kind is not None:
            ops = ops[ops["kind"] == f.op_kind]
        return op_metric(ops, f)


def op_metric(ops: np.ndarray, f: Fired) -> BaselinePanel:
    """The metric ``f`` fired on, per collective of its comm (completion rows).

    ``xfer``: the shortest member start-to-end; ``span``: first start to last
    end; ``late``: the rank's start minus the members' median start.
    """
    seqs, inv = np.unique(ops["seq"], return_inverse=True)
    n = len(seqs)
    start, end = ops["start_ns"].astype(np.int64), ops["end_ns"].astype(np.int64)
    first, last = np.full(n, np.iinfo(np.int64).max), np.zeros(n, np.int64)
    np.minimum.at(first, inv, start)
    np.maximum.at(last, inv, end)
    if f.metric == "span":
        value = last - first
    elif f.metric == "late" and f.rank is not None:
        value = np.full(n, np.nan)
        for i in range(n):
            mine = inv == i
            own = start[mine][ops["rank"][mine] == f.rank]
            if len(own):
                value[i] = own[0] - np.median(start[mine])
    else:
        shortest = np.full(n, np.iinfo(np.int64).max)
        np.minimum.at(shortest, inv, end - start)
        value = shortest
    ok = ~np.isnan(value.astype(np.float64))
    return BaselinePanel(
        f, last[ok], value[ok].astype(np.float64) / 1e9, np.isin(seqs[ok], f.seqs)
    )
