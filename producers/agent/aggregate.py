"""Fold raw ring records into the per-tick columnar rows of ``schemas/columns.py``.

Per rank the aggregator keeps: the communicators it joined (``rc`` rows), the
ops issued and not yet completed with the latest counters of each flow
(``op``/``flow`` rows), and the ops completed since the last tick (completion
rows). Time only comes in through the records; nothing here reads a clock.

A send flow's ready-wait time (``ready_wait_us``, ``schemas/ring.md`` §4c)
comes from the FLOW_STEPS record the NCCL plugin writes right after each
FLOW_PROGRESS of the flow: it is taken when it names the same (comm, seq,
channel, dir, peer) at the same ``ts_ns`` as the flow's latest progress.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from mycroft.producers.ring_layout import (
    Beat,
    Comm,
    CommName,
    CommRanks,
    FlowDone,
    FlowProgress,
    FlowSteps,
    OpDone,
    OpIssued,
    RingRecord,
)
from mycroft.schemas.columns import (
    DONE_FLOW_COLUMNS,
    DONE_OP_COLUMNS,
    FLOW_COLUMNS,
    OP_COLUMNS,
    RC_COLUMNS,
    Group,
    dtype_of,
)
from mycroft.schemas.vocab import SEND

log = logging.getLogger(__name__)

FlowKey = tuple[int, int, int]
"""(channel, peer, direction)"""

READY_WAIT_MAX_US = (1 << 31) - 1
"""The state record's ``ready_wait_us`` column is int32: it saturates here."""


@dataclass
class FlowState:
    """Latest cumulative counters of one flow of one in-flight op."""

    total: int = 0
    gpu_ready: int = 0
    transmitted: int = 0
    done: int = 0
    first_ns: int = 0
    last_ns: int = 0
    seen_ns: int = 0  # ts_ns of the latest FLOW_PROGRESS (the FLOW_STEPS join)
    ready_wait_us: int = 0


@dataclass
class OpState:
    """One issued, not yet completed op of one rank."""

    comm: int
    seq: int
    kind: int = 0
    algo: int = 0
    proto: int = 0
    nbytes: int = 0
    issue_ns: int = 0
    start_ns: int = 0
    flows: dict[FlowKey, FlowState] = field(default_factory=dict)
    done_flows: list[FlowDone] = field(default_factory=list)


@dataclass
class CommState:
    """What the ``rc`` row of one rank x communicator carries."""

    nranks: int = 0
    comm_rank: int = -1
    nchannels: int = 0
    gpu: int = -1
    issued_seq: int = -1
    done_seq: int = -1
    name: str = ""
    members: list[int] = field(default_factory=list)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks of the communicator in its order; () until all are known."""
        if not self.members or min(self.members) < 0:
            return ()
        return tuple(self.members)


@dataclass
class RankState:
    """Everything the agent knows about one training process."""

    rank: int
    pid: int
    local_rank: int = -1
    seen_ns: int = 0
    comms: dict[int, CommState] = field(default_factory=dict)
    ops: dict[tuple[int, int], OpState] = field(default_factory=dict)


@dataclass
class TickRows:
    """The rows of one tick: state (rc/op/flow) and completions (op/flow)."""

    rc: np.ndarray
    op: np.ndarray
    flow: np.ndarray
    done_op: np.ndarray
    done_flow: np.ndarray


class Aggregator:
    """Per-host fold of ring records; :meth:`tick` returns and resets completions.

    Args:
        max_inflight: in-flight ops kept per rank; the oldest is evicted beyond
            it (counted in ``evicted``) so a runaway writer cannot grow memory.
    """

    def __init__(self, max_inflight: int = 4096) -> None:
        self.max_inflight = max_inflight
        self.ranks: dict[str, RankState] = {}
        self.evicted = 0
        self.topology_changed = False
        self._done_ops: list[tuple[object, ...]] = []
        self._done_flows: list[tuple[object, ...]] = []
        self._done_owner: list[tuple[int, int]] = []  # (rank, comm) per done flow
        # comm -> {position: global rank} of this host's ranks (from COMM)
        self.positions: dict[int, dict[int, int]] = {}
        self.sizes: dict[int, int] = {}

    def add_rank(self, source: str, rank: int, pid: int, local_rank: int = -1) -> None:
        """Register a training process (one ring) under key ``source``."""
        self.ranks[source] = RankState(rank, pid, local_rank)

    def remove_rank(self, source: str) -> None:
        """Forget a training process whose ring went away."""
        if self.ranks.pop(source, None) is not None:
            self.topology_changed = True

    def apply(self, source: str, record: RingRecord, *, emit: bool = True) -> None:
        """Fold one record of ``source``; ``emit=False`` only rebuilds state."""
        st = self.ranks[source]
        st.seen_ns = max(st.seen_ns, record.ts_ns)
        if isinstance(record, FlowProgress):
            self._progress(st, record)
        elif isinstance(record, FlowSteps):
            self._steps(st, record)
        elif isinstance(record, OpIssued):
            op = self._op(st, record.comm, record.seq)
            op.kind, op.algo, op.proto = record.kind, record.algo, record.proto
            op.nbytes, op.issue_ns = record.nbytes, record.ts_ns
        elif isinstance(record, FlowDone):
            self._op(st, record.comm, record.seq).done_flows.append(record)
        elif isinstance(record, OpDone):
            self._complete(st, record, emit)
        elif isinstance(record, Comm):
            cs = st.comms.setdefault(record.comm, CommState())
            cs.nranks, cs.comm_rank = record.nranks, record.comm_rank
            cs.nchannels, cs.gpu = record.nchannels, record.gpu
            if 0 <= record.comm_rank < record.nranks:
                self.positions.setdefault(record.comm, {})[record.comm_rank] = st.rank
                self.sizes[record.comm] = record.nranks
            self.topology_changed = True
        elif isinstance(record, CommRanks | CommName):
            self._membership(st.comms.setdefault(record.comm, CommState()), record)
        elif not isinstance(record, Beat):  # pragma: no cover - exhaustive union
            raise TypeError(f"unknown ring record {record!r}")

    def members(self, comm: int) -> tuple[int, ...]:
        """Global ranks of ``comm`` in its order as this host knows them.

        A ring that listed them (COMM_RANKS) gives them (``()`` until all
        are listed). Without one (the NCCL plugin), the host's own ranks at
        their positions and ``-1`` at the others: a partial declaration
        (``streams/core/membership.py``), unless every member runs here.
        """
        listed = [
            cs.ranks for st in self.ranks.values()
            if (cs := st.comms.get(comm)) is not None and cs.members
        ]  # fmt: skip
        if listed:
            return max(listed, key=len)
        known = self.positions.get(comm, {})
        return tuple(known.get(i, -1) for i in range(self.sizes.get(comm, 0)))

    def _peer_map(self, cs: CommState, comm: int) -> tuple[int, ...] | None:
        """Position -> global rank for flow peers of a rank's ``comm``: only
        where its ring listed no members (peers are positions, ``ring.md``
        §4b) and every position is known on this host."""
        if cs.members:
            return None
        known = self.positions.get(comm, {})
        if not known or len(known) != self.sizes.get(comm):
            return None
        return tuple(known[i] for i in range(len(known)))

    def _membership(self, cs: CommState, record: CommRanks | CommName) -> None:
        if isinstance(record, CommName):
            cs.name = record.text
        else:
            if len(cs.members) != record.nranks:
                cs.members = [-1] * max(record.nranks, 0)
            for i, r in enumerate(record.ranks):
                if 0 <= record.first + i < len(cs.members):
                    cs.members[record.first + i] = r
        self.topology_changed = True

    def _op(self, st: RankState, comm: int, seq: int) -> OpState:
        op = st.ops.get((comm, seq))
        if op is None:
            op = st.ops[(comm, seq)] = OpState(comm, seq)
            cs = st.comms.setdefault(comm, CommState())
            cs.issued_seq = max(cs.issued_seq, seq)
            if len(st.ops) > self.max_inflight:
                oldest = next(iter(st.ops))
                del st.ops[oldest]
                self.evicted += 1
                log.warning(
                    "rank %d: evicted in-flight op %s (limit %d)",
                    st.rank,
                    oldest,
                    self.max_inflight,
                )
        return op

    def _progress(self, st: RankState, r: FlowProgress) -> None:
        op = self._op(st, r.comm, r.seq)
        if op.issue_ns == 0:
            op.issue_ns = r.ts_ns
        fs = op.flows.setdefault((r.channel, r.peer, r.direction), FlowState())
        fs.seen_ns = r.ts_ns
        new = (r.total, r.gpu_ready, r.transmitted, r.done)
        if new != (fs.total, fs.gpu_ready, fs.transmitted, fs.done):
            fs.total, fs.gpu_ready, fs.transmitted, fs.done = new
            if r.gpu_ready or r.transmitted or r.done:
                fs.last_ns = r.ts_ns
                if fs.first_ns == 0:
                    fs.first_ns = r.ts_ns
                if op.start_ns == 0 or r.ts_ns < op.start_ns:
                    op.start_ns = r.ts_ns

    @staticmethod
    def _steps(st: RankState, r: FlowSteps) -> None:
        """Join a send flow's ready-wait time to the progress it was written
        with; a FLOW_STEPS whose progress was lost (overwritten) or that
        belongs to an op already completed is dropped."""
        if r.direction != SEND:
            return
        op = st.ops.get((r.comm, r.seq))
        fs = op.flows.get((r.channel, r.peer, r.direction)) if op else None
        if fs is None or fs.seen_ns != r.ts_ns:
            return
        # The plugin writes an unsaturated u32 into a field the layout
        # decodes as i32; the column is int32.
        fs.ready_wait_us = min(r.ready_wait_us & 0xFFFFFFFF, READY_WAIT_MAX_US)

    def _complete(self, st: RankState, r: OpDone, emit: bool) -> None:
        op = st.ops.pop((r.comm, r.seq), None) or OpState(r.comm, r.seq)
        cs = st.comms.setdefault(r.comm, CommState())
        cs.done_seq = max(cs.done_seq, r.seq)
        cs.issued_seq = max(cs.issued_seq, r.seq)
        if not emit:
            return
        if op.done_flows:
            flows = [
                (f.channel, f.peer, f.direction, f.chunks, f.first_ns, f.ts_ns)
                + (f.wire_us * 1000,)
                for f in op.done_flows
            ]
        else:  # FLOW_DONE records lost (overwritten): fall back to the last snapshots
            flows = [
                (k[0], k[1], k[2], s.done, s.first_ns, s.last_ns, 0)
                for k, s in sorted(op.flows.items())
            ]
        start = r.start_ns or op.start_ns
        self._done_ops.append(
            (
                st.rank,
                r.comm,
                r.seq,
                op.kind,
                op.nbytes,
                op.issue_ns or start,
                start,
                r.ts_ns,
                len(flows),
            )
        )
        self._done_flows.extend(flows)
        self._done_owner.extend([(st.rank, r.comm)] * len(flows))

    def tick(self) -> TickRows:
        """Rows of the current state plus the completions since the last tick."""
        rc: list[tuple[object, ...]] = []
        ops: list[tuple[object, ...]] = []
        flows: list[tuple[object, ...]] = []
        for st in sorted(self.ranks.values(), key=lambda s: s.rank):
            for comm, cs in sorted(st.comms.items()):
                rc.append((st.rank, comm, cs.issued_seq, cs.done_seq, st.seen_ns))
            for (comm, seq), op in sorted(st.ops.items()):
                ops.append(
                    (
                        st.rank,
                        comm,
                        seq,
                        op.kind,
                        op.algo,
                        op.proto,
                        op.nbytes,
                        op.issue_ns,
                        op.start_ns,
                        len(op.flows),
                    )
                )
                table = self._peer_map(st.comms.get(comm, CommState()), comm)
                flows.extend(
                    (
                        k[0],
                        _mapped(table, k[1]),
                        k[2],
                        s.total,
                        s.gpu_ready,
                        s.transmitted,
                        s.done,
                        s.last_ns,
                        s.ready_wait_us,
                    )
                    for k, s in sorted(op.flows.items())
                )
        rows = TickRows(
            _rows(rc, RC_COLUMNS),
            _rows(ops, OP_COLUMNS),
            _rows(flows, FLOW_COLUMNS),
            _rows(self._done_ops, DONE_OP_COLUMNS),
            _rows(self._done_flows, DONE_FLOW_COLUMNS),
        )
        self._map_done_peers(rows.done_flow)
        self._done_ops, self._done_flows, self._done_owner = [], [], []
        return rows

    def _map_done_peers(self, flow: np.ndarray) -> None:
        """Completion flow peers as ``tick`` maps the in-flight ones: with
        what the host knows now, the knowledge its topology says."""
        by_rank = {st.rank: st for st in self.ranks.values()}
        tables: dict[tuple[int, int], tuple[int, ...] | None] = {}
        for i, key in enumerate(self._done_owner):
            if key not in tables:
                st = by_rank.get(key[0])
                cs = st.comms.get(key[1]) if st is not None else None
                tables[key] = None if cs is None else self._peer_map(cs, key[1])
            table = tables[key]
            if table is not None:
                flow["peer"][i] = _mapped(table, int(flow["peer"][i]))


def _mapped(table: tuple[int, ...] | None, peer: int) -> int:
    """``peer``, a position in the comm, as a global rank (``-1``: outside)."""
    if table is None:
        return peer
    return table[peer] if 0 <= peer < len(table) else -1


def _rows(rows: list[tuple[object, ...]], group: Group) -> np.ndarray:
    return np.array(rows, dtype=dtype_of(group))
