"""Sample op blocks at every host's ticks into StateBatch / CompletionBatch.

Each host samples on its own clock: tick ``k`` is at host time ``k * interval``
after the trace start, i.e. at reference time ``k * interval - offset[host]``.
All record timestamps are host clock, ns since the Unix epoch.

Per tick and host the emitter writes one StateBatch (always, with one rc row
per rank x communicator) and one CompletionBatch only when an op completed:
the StateBatch already proves the agent alive, so empty completions would
only add volume. A heartbeat follows every second. A crashed rank's op and
flow rows vanish at the crash; its rc rows stay with ``seen_ns`` frozen (the
agent still reports the last state it read from the rank's ring buffer).
``seen_ns`` is the tracer's liveness beat: tick time while the process is
alive (busy or idle), frozen at the crash once it died.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.layout import Layout, host_name, nic_name
from mycroft.producers.sim.opblock import DONE, GPU_READY, TRANSMITTED, OpBlock
from mycroft.producers.tracefile import RecordWriter
from mycroft.schemas.columns import (
    DONE_FLOW_COLUMNS,
    DONE_OP_COLUMNS,
    FLOW_COLUMNS,
    OP_COLUMNS,
    RC_COLUMNS,
    empty,
)
from mycroft.schemas.records import (
    BatchHeader,
    CompletionBatch,
    Heartbeat,
    NicPort,
    RankHealth,
    StateBatch,
)
from mycroft.schemas.vocab import SEND

READY_WAIT_MAX_US = (1 << 31) - 1
"""The state record's ``ready_wait_us`` column is int32: it saturates here."""

PortState = Callable[
    [np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]
]
"""``(ranks, reference times) -> (link outages begun, outage going on,
retrains recovered)`` of each rank's NIC port (``Effects.port_state``)."""


@dataclass
class Rows:
    """Row groups of all hosts for one tick, with the host of every row."""

    op: list[np.ndarray] = field(default_factory=list)
    op_host: list[np.ndarray] = field(default_factory=list)
    flow: list[np.ndarray] = field(default_factory=list)
    flow_host: list[np.ndarray] = field(default_factory=list)

    def split(
        self, nhosts: int, op_cols: np.ndarray, flow_cols: np.ndarray
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Concatenate and cut per host, keeping op order inside a host."""
        ops = np.concatenate(self.op) if self.op else op_cols
        flows = np.concatenate(self.flow) if self.flow else flow_cols
        return _by_host(ops, self.op_host, nhosts), _by_host(
            flows, self.flow_host, nhosts
        )


def _by_host(
    rows: np.ndarray, hosts: list[np.ndarray], nhosts: int
) -> list[np.ndarray]:
    if not hosts:
        return [rows[:0]] * nhosts
    host = np.concatenate(hosts)
    order = np.argsort(host, kind="stable")
    bounds = np.searchsorted(host[order], np.arange(nhosts + 1))
    rows = rows[order]
    return [rows[bounds[h] : bounds[h + 1]] for h in range(nhosts)]


class Emitter:
    """Turn the schedule's op blocks into records, tick by tick."""

    def __init__(
        self,
        cfg: SimConfig,
        layout: Layout,
        offsets_s: np.ndarray,
        started_s: np.ndarray,
        writer: RecordWriter,
        *,
        proc_dead_s: np.ndarray | None = None,
        port_state: PortState | None = None,
        drift: np.ndarray | None = None,
    ) -> None:
        self.cfg = cfg
        # Host clock rate error (fraction, e.g. 3e-5 = 30 ppm); None = exact.
        self.drift = drift
        # The tracer's liveness beat (a daemon thread, every 0.1 s) keeps an
        # alive process's seen_ns fresh even while it is idle; it stops when
        # the process dies (reference seconds, inf = never).
        self.proc_dead = (
            np.full(layout.nranks, np.inf)
            if proc_dead_s is None
            else np.asarray(proc_dead_s, dtype=np.float64)
        )
        self.port_state = port_state
        self.layout = layout
        self.off = offsets_s
        self.writer = writer
        nslots = len(layout.slot_rank)
        self.issued = np.full(nslots, -1, dtype=np.int64)
        self.done = np.full(nslots, -1, dtype=np.int64)
        self.last_event = started_s.copy()
        self.seen_rank = started_s.copy()
        self.tick = 0
        self.ticks_total = int(round(cfg.duration_s * 1000)) // cfg.interval_ms
        self.hb_every = max(1, round(1000 / cfg.interval_ms))
        self.rows_read = np.zeros(layout.nhosts, dtype=np.int64)
        self.batches = np.zeros(layout.nhosts, dtype=np.int64)
        self.records = 0

    def ns(self, t: np.ndarray, host: np.ndarray) -> np.ndarray:
        """Reference seconds -> host-clock ns since the epoch."""
        local = t + self.off[host]
        if self.drift is not None:
            local = local + self.drift[host] * t
        out: np.ndarray = np.rint(local * 1e9).astype(np.int64)
        return out + self.cfg.start_ns

    def tick_times(self, k: int) -> np.ndarray:
        """Reference time at which every host takes tick ``k``."""
        if self.drift is not None:
            out: np.ndarray = (k * self.cfg.interval_s - self.off) / (1 + self.drift)
            return out
        return k * self.cfg.interval_s - self.off

    def run_until(self, blocks: list[OpBlock], horizon_s: float) -> list[OpBlock]:
        """Emit every tick all hosts take before ``horizon_s``; return live blocks."""
        while self.tick < self.ticks_total:
            t_h = self.tick_times(self.tick + 1)
            if t_h.max() >= horizon_s:
                break
            self.tick += 1
            self._emit_tick(blocks, t_h)
            t_min = float(t_h.min())
            blocks = [b for b in blocks if b.t_hi > t_min]
        return blocks

    def _emit_tick(self, blocks: list[OpBlock], t_h: np.ndarray) -> None:
        state, done = Rows(), Rows()
        busy = np.zeros(self.layout.nranks, dtype=bool)
        hi = float(t_h.max())
        for b in blocks:
            if b.t_lo > hi:
                continue
            tt = t_h[b.host]
            self._events(b, tt)
            self._state_rows(b, tt, state, busy)
            self._done_rows(b, tt, done)
        self._write(t_h, state, done, busy)

    def _events(self, b: OpBlock, tt: np.ndarray) -> None:
        prev = tt - self.cfg.interval_s
        issued = (b.issue > prev) & (b.issue <= tt)
        if issued.any():
            np.maximum.at(self.issued, b.slot[issued], b.seq[issued])
            np.maximum.at(self.last_event, b.rank[issued], b.issue[issued])
        ended = (b.end > prev) & (b.end <= tt)
        if ended.any():
            np.maximum.at(self.done, b.slot[ended], b.seq[ended])
            np.maximum.at(self.last_event, b.rank[ended], b.end[ended])

    def _state_rows(
        self, b: OpBlock, tt: np.ndarray, out: Rows, busy: np.ndarray
    ) -> None:
        live = (b.issue <= tt) & (b.end > tt) & (tt < b.proc_dead)
        rows = np.flatnonzero(live)
        if not len(rows):
            return
        t = tt[rows]
        host = b.host[rows]
        busy[b.rank[rows]] = True
        op = empty(OP_COLUMNS, len(rows))
        _common(op, b, rows)
        op["algo"], op["proto"] = b.algo, b.proto
        op["issue_ns"] = self.ns(b.issue[rows], host)
        start = b.start[rows]
        op["start_ns"] = np.where(start <= t, self.ns(np.minimum(start, t), host), 0)
        op["nflows"] = b.nflows
        value, last = b.counters(rows, t)
        fl = empty(FLOW_COLUMNS, value.shape[0] * value.shape[1])
        fhost = np.repeat(host, b.nflows)
        _flow_ids(fl, b, rows)
        fl["total"] = b.total(rows).ravel()
        fl["gpu_ready"] = value[..., GPU_READY].ravel()
        fl["transmitted"] = value[..., TRANSMITTED].ravel()
        fl["done"] = value[..., DONE].ravel()
        last = last.ravel()
        fl["last_ns"] = np.where(
            np.isfinite(last), self.ns(np.where(np.isfinite(last), last, 0.0), fhost), 0
        )
        if b.nccl:
            wait_us = np.rint(b.ready_wait(rows, t).ravel() * 1e6)
            fl["ready_wait_us"] = np.minimum(wait_us, READY_WAIT_MAX_US)
        out.op.append(op)
        out.op_host.append(host)
        out.flow.append(fl)
        out.flow_host.append(fhost)

    def _done_rows(self, b: OpBlock, tt: np.ndarray, out: Rows) -> None:
        rows = np.flatnonzero((b.end > tt - self.cfg.interval_s) & (b.end <= tt))
        if not len(rows):
            return
        host = b.host[rows]
        op = empty(DONE_OP_COLUMNS, len(rows))
        _common(op, b, rows)
        op["issue_ns"] = self.ns(b.issue[rows], host)
        op["start_ns"] = self.ns(b.start[rows], host)
        op["end_ns"] = self.ns(b.end[rows], host)
        op["nflows"] = b.nflows
        fl = empty(DONE_FLOW_COLUMNS, len(rows) * b.nflows)
        fhost = np.repeat(host, b.nflows)
        _flow_ids(fl, b, rows)
        fl["chunks"] = b.total(rows).ravel()
        fl["first_ns"] = self.ns(b.first[rows].ravel(), fhost)
        fl["last_ns"] = self.ns(b.last[rows].ravel(), fhost)
        fl["wire_ns"] = self._wire_ns(b, rows)
        out.op.append(op)
        out.op_host.append(host)
        out.flow.append(fl)
        out.flow_host.append(fhost)

    def _wire_ns(self, b: OpBlock, rows: np.ndarray) -> np.ndarray:
        """Per flow of ``rows``, the time its data spent on the network, as
        NCCL's ProxyStep events time it: per step, from the post (``isend``,
        once the step's data is all in the FIFO and the receiver granted the
        slot: the later of G's end and T's start) to done (D's end), summed
        over the steps. Receive flows and flows within a host get 0: NCCL
        times only the network transport's sends that way."""
        r, p = rows[:, None], b.fprof[rows]  # each (m, F, step): only what it uses
        posted = np.maximum(b.times[r, p, GPU_READY, 1], b.times[r, p, TRANSMITTED, 0])
        wire = np.maximum(b.times[r, p, DONE, 1] - posted, 0.0).sum(axis=-1)
        peer = np.clip(b.fpeer[rows], 0, len(self.layout.host_of) - 1)
        net = (b.fdir[rows] == SEND) & (
            self.layout.host_of[peer] != b.host[rows][:, None]
        )
        ok = net & np.isfinite(wire)
        out: np.ndarray = np.where(ok, np.round(wire * 1e9), 0)
        return out.astype(np.int64).ravel()

    def _rc(self, t_h: np.ndarray, busy: np.ndarray) -> np.ndarray:
        lay = self.layout
        rank = lay.slot_rank
        t_rank = t_h[lay.host_of]
        # Liveness beat: fresh while the process lives, its last beat (the
        # crash time) once it died.
        seen = np.where(
            busy | (t_rank < self.proc_dead), t_rank, np.minimum(self.proc_dead, t_rank)
        )
        rc = empty(RC_COLUMNS, len(rank))
        rc["rank"], rc["comm"] = rank, lay.slot_comm
        rc["issued_seq"], rc["done_seq"] = self.issued, self.done
        rc["seen_ns"] = self.ns(seen[rank], lay.host_of[rank])
        self.seen_rank = seen
        return rc

    def _write(
        self, t_h: np.ndarray, state: Rows, done: Rows, busy: np.ndarray
    ) -> None:
        lay, cfg = self.layout, self.cfg
        rc = self._rc(t_h, busy)
        s_ops, s_flows = state.split(lay.nhosts, empty(OP_COLUMNS), empty(FLOW_COLUMNS))
        d_ops, d_flows = done.split(
            lay.nhosts, empty(DONE_OP_COLUMNS), empty(DONE_FLOW_COLUMNS)
        )
        tick_ns = cfg.start_ns + round(self.tick * cfg.interval_s * 1e9)
        for h in range(lay.nhosts):
            header = BatchHeader(
                cfg.job_id,
                host_name(h),
                self.epoch_ns(h),
                self.tick,
                tick_ns,
                cfg.interval_ms,
            )
            lo, hi = lay.host_slots[h], lay.host_slots[h + 1]
            self.writer.write(
                StateBatch(header, rc[lo:hi], s_ops[h], s_flows[h]), tick_ns
            )
            n = len(s_ops[h]) + len(s_flows[h]) + len(d_ops[h]) + len(d_flows[h])
            self.rows_read[h] += n + hi - lo
            self.batches[h] += 1
            self.records += 1
            if len(d_ops[h]):
                self.writer.write(
                    CompletionBatch(header, d_ops[h], d_flows[h]), tick_ns
                )
                self.batches[h] += 1
                self.records += 1
        if self.tick % self.hb_every == 0:
            self._heartbeats(tick_ns, t_h)

    def epoch_ns(self, host: int) -> int:
        """Agent start time of ``host``: the trace start on its clock, minus 1 s."""
        return self.cfg.start_ns - 1_000_000_000 + round(float(self.off[host]) * 1e9)

    def _ports(self, t_h: np.ndarray) -> list[tuple[NicPort, ...]]:
        """Every host's NIC ports at its tick (port 1 of each NIC; the
        counters saturate at 255 like the hardware's). ``Noise`` adds
        storage NICs no rank uses and counters that start above zero."""
        lay = self.layout
        if self.port_state is None:
            return [()] * lay.nhosts
        noise = self.cfg.noise
        base = noise.port_counters_base
        gpn = self.cfg.hardware.gpus_per_nic
        first = np.flatnonzero(lay.local_of % gpn == 0)  # one rank per NIC
        downs, down_now, recovered = self.port_state(first, t_h[lay.host_of[first]])
        out: list[list[NicPort]] = [[] for _ in range(lay.nhosts)]
        for r, n, down, rec in zip(
            first.tolist(),
            downs.tolist(),
            down_now.tolist(),
            recovered.tolist(),
            strict=True,
        ):
            nic = nic_name(int(lay.local_of[r]) // gpn)
            out[int(lay.host_of[r])].append(
                NicPort(nic, 1, not down, min(n + base, 255), min(rec, 255))
            )
        nics = self.cfg.hardware.gpus_per_host // gpn
        for ports in out:
            for i in range(noise.storage_nics):
                ports.append(NicPort(nic_name(nics + i), 1, True, base, 0))
        return [tuple(p) for p in out]

    def _heartbeats(self, tick_ns: int, t_h: np.ndarray) -> None:
        lay, cfg = self.layout, self.cfg
        seen_ns = self.ns(self.seen_rank, lay.host_of)
        ports = self._ports(t_h)
        for h in range(lay.nhosts):
            ranks = lay.host_ranks(h)
            health = tuple(
                RankHealth(int(r), 10_000 + int(lay.local_of[r]), int(seen_ns[r]), 0, 0)
                for r in ranks
            )
            hb = Heartbeat(
                cfg.job_id,
                host_name(h),
                self.epoch_ns(h),
                tick_ns,
                cfg.interval_ms,
                0.0,
                int(self.rows_read[h]),
                int(self.batches[h]),
                0,
                0,
                0,
                0,
                health,
                ports[h],
            )
            self.writer.write(hb, tick_ns)
            self.records += 1


def _common(op: np.ndarray, b: OpBlock, rows: np.ndarray) -> None:
    op["rank"], op["comm"], op["seq"] = b.rank[rows], b.comm[rows], b.seq[rows]
    op["kind"], op["bytes"] = b.kind[rows], b.nbytes[rows]


def _flow_ids(fl: np.ndarray, b: OpBlock, rows: np.ndarray) -> None:
    fl["channel"] = b.fchan[rows].ravel()
    fl["peer"] = b.fpeer[rows].ravel()
    fl["dir"] = b.fdir[rows].ravel()
