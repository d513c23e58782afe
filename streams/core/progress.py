"""Per (job, communicator, rank) progress state, fed batch by batch with numpy.

Nothing here loops over rows in Python: a StateBatch costs a handful of
vectorised operations whatever its size. Timestamps stay on the reporting
host's clock; comparisons across hosts tolerate a few ms of offset.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib import recfunctions as rfn

from mycroft.schemas.records import CompletionBatch, NicPort, StateBatch
from mycroft.schemas.vocab import SEND
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.ports import PortLog
from mycroft.streams.core.rows import stack_rows
from mycroft.streams.core.transfer_times import TransferTimes, WireWatch

FLAT_FLOW = np.dtype(
    [
        ("tick_ns", "<i8"),
        ("rank", "<i4"),
        ("comm", "<u8"),
        ("seq", "<i8"),
        ("channel", "<i2"),
        ("peer", "<i4"),
        ("dir", "<u1"),
        ("total", "<i4"),
        ("gpu_ready", "<i4"),
        ("transmitted", "<i4"),
        ("done", "<i4"),
        ("last_ns", "<i8"),
        ("ready_wait_us", "<i4"),
        ("rw_chunks", "<i4"),
    ]
)
"""One flow of one in-flight op at one tick, its op identity repeated.

``ready_wait_us`` is the producer's cumulative ready-wait time of a send
flow (``schemas/ring.md`` §4c; 0: not measured); ``rw_chunks`` what the
growth of it since the flow's previous snapshot stands for in chunks
(:func:`ready_wait_chunks`), the ready-not-sent backlog a producer that
reports a send's G at most T + 1 cannot show as G - T (:func:`held_ready`).
"""

_FLOW_KEY = ("rank", "comm", "seq", "channel", "peer", "dir")
"""What identifies one flow of one op across snapshots."""

_SLOT_FIELDS = (
    ("rank", "<i4"),
    ("comm", "<u8"),
    ("host", "<i4"),
    ("issued", "<i8"),
    ("done", "<i8"),
    ("seen_ns", "<i8"),
    ("tick_ns", "<i8"),
    ("issued_change_ns", "<i8"),
    ("done_change_ns", "<i8"),
)
SLOT = np.dtype(list(_SLOT_FIELDS))
"""Latest rank-state of one (rank, comm): the ``rc`` row plus change times."""


_OP_PLUS = np.dtype(
    [
        ("rank", "<i4"),
        ("comm", "<u8"),
        ("seq", "<i8"),
        ("kind", "<u1"),
        ("bytes", "<i8"),
        ("issue_ns", "<i8"),
        ("start_ns", "<i8"),
        ("prog_ns", "<i8"),
        ("tick_ns", "<i8"),
        ("host", "<i4"),
    ]
)
"""An in-flight op row plus ``prog_ns``: its last progress of any kind."""


BEAT_AHEAD_NS = 10_000_000_000
"""How far a host's heartbeats may run ahead of its state batches before
they count as its position (a worker behind on the state topic), ns."""


@dataclass
class HostState:
    """What one host last said, and when it said it."""

    index: int
    name: str
    last_tick_ns: int = 0  # newest state batch (the host's position in its stream)
    last_now_ns: int = 0
    beat_tick_ns: int = 0  # newest heartbeat, host clock
    gap_ns: float = 0.0
    batches: int = 0
    ops: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=_OP_PLUS))
    flows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=FLAT_FLOW))
    history: deque[np.ndarray] = field(default_factory=deque)
    rc_rows: bytes = b""  # (rank, comm) columns of the last state batch
    rc_slots: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))
    sends: deque[tuple[int, dict[tuple[int, int], np.ndarray]]] = field(
        default_factory=deque
    )  # per ``history`` entry: (tick, op_flow_index of it)
    reports_recv: bool = False  # its producer reports receive flows

    def keep_snapshot(self, tick_ns: int, flat: np.ndarray) -> None:
        """Append one flow snapshot (``FLAT_FLOW``) to the history."""
        self.history.append(flat)
        self.sends.append((tick_ns, op_flow_index(flat)))
        self.reports_recv = self.reports_recv or bool((flat["dir"] != SEND).any())

    def snapshot_state(self) -> dict[str, object]:
        """Snapshot state (worker snapshots) with the flow history, without its
        per-entry index of started sends (rebuilt on restore).

        The history is most of a job's state (``history_s`` of flow
        snapshots per host: ~0.3 MB compressed at 64 ranks), and a slowdown
        whose root cause is computed within ``history_s`` after a restore
        reads it: without it, a restarted worker named other culprits than
        ``mycroft analyze`` on the same records.
        """
        state = dict(self.__dict__)
        state["sends"] = [tick for tick, _ in self.sends]
        return state

    def restore_state(self, state: dict[str, object]) -> None:
        """Restore from :meth:`snapshot_state`."""
        ticks = state.pop("sends")
        self.__dict__.update(state)
        self.sends = deque(
            (tick, op_flow_index(flat))
            for tick, flat in zip(ticks, self.history, strict=True)  # type: ignore[call-overload]
        )


def flatten_flows(batch: StateBatch) -> tuple[np.ndarray, np.ndarray]:
    """Expand a batch's op identity onto its flows.

    Args:
        batch: One host's state at one tick.

    Returns:
        ``(ops, flows)``: op rows with ``prog_ns`` (max of issue, start and
        flow ``last_ns``, ns) and the flat flow table (``FLAT_FLOW``).
    """
    op, fl = batch.op, batch.flow
    nflows = np.maximum(op["nflows"].astype(np.int64), 0)
    if int(nflows.sum()) != len(fl):  # malformed batch: keep ops, drop flows
        nflows = np.zeros(len(op), dtype=np.int64)
        fl = fl[:0]
    flat = np.zeros(len(fl), dtype=FLAT_FLOW)
    flat["tick_ns"] = batch.header.tick_ns
    for name in ("rank", "comm", "seq"):
        flat[name] = np.repeat(op[name], nflows)
    for name in ("channel", "peer", "dir", "total", "gpu_ready", "transmitted"):
        flat[name] = fl[name]
    flat["done"] = fl["done"]
    flat["last_ns"] = fl["last_ns"]
    flat["ready_wait_us"] = np.maximum(fl["ready_wait_us"], 0)
    ops = np.zeros(len(op), dtype=_OP_PLUS)
    for name in ("rank", "comm", "seq", "kind", "bytes", "issue_ns", "start_ns"):
        ops[name] = op[name]
    prog = np.maximum(op["issue_ns"], op["start_ns"])
    has = nflows > 0
    if has.any():
        starts = np.concatenate(([0], np.cumsum(nflows)[:-1]))[has]
        prog[has] = np.maximum(prog[has], np.maximum.reduceat(fl["last_ns"], starts))
    ops["prog_ns"] = prog
    ops["tick_ns"] = batch.header.tick_ns
    return ops, flat


def held_ready(rows: np.ndarray) -> np.ndarray:
    """Chunks each flow row holds ready and not sent, as the G-T rules read
    them: ``G - T``, or what its head's ready-wait stood for since the
    previous snapshot (``rw_chunks``) when more.

    NCCL's proxy checks readiness only for its head step, so the NCCL
    plugin's send G is at most T + 1 and a backlog shows as time instead
    (``schemas/ring.md`` §4c); other producers report G - T and no wait.
    """
    gap = rows["gpu_ready"].astype(np.int64) - rows["transmitted"]
    out: np.ndarray = np.maximum(gap, rows["rw_chunks"])
    return out


def ready_wait_chunks(
    flat: np.ndarray, prev: np.ndarray, op_start_ns: np.ndarray, chunks: float
) -> np.ndarray:
    """``rw_chunks`` of a snapshot's flows: the share of the time since the
    flow's previous snapshot ``prev`` (the same host's; else since its op's
    first progress, ``op_start_ns`` per flow row) its head step spent ready
    and not taken, times ``chunks`` (``DetectorConfig.ready_wait_chunks``),
    rounded. 0 where the producer measures no ready-wait.

    A head step waiting a whole interval is a full FIFO behind it: the
    GPU goes on filling the slots the proxy offered it, which is the G - T a
    producer that sees every slot reports (the simulator's ``slots``
    counters: up to its 8 slots).
    """
    out = np.zeros(len(flat), dtype=np.int32)
    has = np.flatnonzero(flat["ready_wait_us"] > 0)
    if not len(has):
        return out
    base_ns = op_start_ns[has].astype(np.int64)
    base_us = np.zeros(len(has), dtype=np.int64)
    before = prev[prev["dir"] == SEND]
    if len(before):
        at, found = _match(flat[has], before)
        ok = found & (before["tick_ns"][at] < flat["tick_ns"][has])
        base_ns = np.where(ok, before["tick_ns"][at], base_ns)
        base_us = np.where(ok, before["ready_wait_us"][at], 0)
    span_ns = flat["tick_ns"][has] - base_ns
    waited_ns = (flat["ready_wait_us"][has] - base_us) * 1000
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(
            (base_ns > 0) & (span_ns > 0), np.clip(waited_ns / span_ns, 0.0, 1.0), 0.0
        )
    out[has] = np.rint(share * chunks).astype(np.int32)
    return out


def _match(rows: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index into ``table`` of each row's flow (``_FLOW_KEY``), and whether
    it has one."""
    keyed = rfn.repack_fields(table[list(_FLOW_KEY)])
    want = rfn.repack_fields(rows[list(_FLOW_KEY)]).astype(keyed.dtype)
    kb = keyed.view(f"V{keyed.dtype.itemsize}")
    wb = want.view(f"V{keyed.dtype.itemsize}")
    order = np.argsort(kb, kind="stable")
    pos = np.searchsorted(kb[order], wb)
    at = order[np.minimum(pos, len(order) - 1)]
    found: np.ndarray = (pos < len(order)) & (kb[at] == wb)
    return at, found


def op_flow_index(flat: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """Return the started, unfinished send flows and every receive flow of
    one snapshot by op.

    Started means something is ready and not all is done: before a flow's
    first chunk and after its last, every counter gap is zero. A receive
    flow's G tells which of its sender's data it had posted buffers for
    (``flow_features.sent_and_posted``). Keys are ``(comm, seq)``; rows keep
    their order. Built once per snapshot so that each completed op looks
    its flows up instead of scanning snapshots.
    """
    send = flat["dir"] == SEND
    f = flat[~send | ((flat["gpu_ready"] > 0) & (flat["done"] < flat["total"]))]
    if not len(f):
        return {}
    f = f[np.lexsort((f["seq"], f["comm"]))]
    cut = (
        np.flatnonzero(
            (f["comm"][1:] != f["comm"][:-1]) | (f["seq"][1:] != f["seq"][:-1])
        )
        + 1
    )
    first = np.concatenate([[0], cut])
    keys = zip(f["comm"][first].tolist(), f["seq"][first].tolist(), strict=True)
    return dict(zip(keys, np.split(f, cut), strict=True))


class ProgressStore:
    """Latest rank-state per (rank, comm), in-flight ops and flow history per host.

    Invariants: ``issued``/``done`` never move backwards (a stale, reordered
    row is ignored); ``*_change_ns`` is the host tick at which the value last
    changed; ``history`` holds at most ``history_ns`` of flow snapshots.
    """

    def __init__(
        self,
        history_ns: int,
        transfers: tuple[int, int] = (
            DetectorConfig.transfer_rows_per_rank,
            DetectorConfig.transfer_rows_min,
        ),
        ready_wait_chunks: float = DetectorConfig.ready_wait_chunks,
    ) -> None:
        self.history_ns = history_ns
        self.ready_wait_chunks = ready_wait_chunks
        self.transfers = TransferTimes(*transfers)
        self.hosts: dict[str, HostState] = {}
        self.slots = np.zeros(0, dtype=SLOT)
        self._keys = np.zeros(0, dtype=np.uint64)  # sorted
        self._key_slot = np.zeros(0, dtype=np.int64)
        self._comm_code: dict[int, int] = {}
        self.ports = PortLog()
        self.wire = WireWatch()

    def host(self, name: str) -> HostState:
        """Return the state of host ``name``, creating it."""
        hs = self.hosts.get(name)
        if hs is None:
            hs = self.hosts[name] = HostState(len(self.hosts), name)
        return hs

    def comm_count(self) -> int:
        """Number of communicators seen so far."""
        return len(self._comm_code)

    def _slot_index(self, rank: np.ndarray, comm: np.ndarray) -> np.ndarray:
        codes = self._codes(comm)
        keys = (codes << np.uint64(32)) | rank.astype(np.uint64)
        if not len(self._keys):
            self._add_slots(keys, rank, comm)
        pos = np.searchsorted(self._keys, keys)
        pos_c = np.minimum(pos, len(self._keys) - 1)
        found = self._keys[pos_c] == keys
        if not found.all():
            self._add_slots(keys[~found], rank[~found], comm[~found])
            return self._slot_index(rank, comm)
        return self._key_slot[pos_c]

    def _codes(self, comm: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(comm, return_inverse=True)
        codes = np.array(
            [self._comm_code.setdefault(int(c), len(self._comm_code)) for c in uniq],
            dtype=np.uint64,
        )
        return codes[inv]

    def _add_slots(self, keys: np.ndarray, rank: np.ndarray, comm: np.ndarray) -> None:
        keys, first = np.unique(keys, return_index=True)
        new = np.zeros(len(keys), dtype=SLOT)
        new["rank"], new["comm"] = rank[first], comm[first]
        new["issued"] = new["done"] = -1
        base = len(self.slots)
        self.slots = np.concatenate([self.slots, new])
        all_keys = np.concatenate([self._keys, keys])
        all_slots = np.concatenate([self._key_slot, np.arange(base, base + len(keys))])
        order = np.argsort(all_keys, kind="stable")
        self._keys, self._key_slot = all_keys[order], all_slots[order]

    def ingest_state(self, batch: StateBatch, now_ns: int) -> None:
        """Fold one host's state batch in (vectorised over its rows)."""
        hs = self.host(batch.header.host)
        tick = batch.header.tick_ns
        self._touch_host(hs, tick, now_ns)
        rc = batch.rc
        if len(rc):
            # A host reports the same (rank, comm) rows tick after tick, and
            # slots are only ever appended: its last lookup usually holds.
            rows = rc["rank"].tobytes() + rc["comm"].tobytes()
            if rows != hs.rc_rows:
                hs.rc_rows = rows
                hs.rc_slots = self._slot_index(rc["rank"], rc["comm"])
            self._fold_rc(hs.rc_slots, rc, tick, hs.index)
        ops, flat = flatten_flows(batch)
        ops["host"] = hs.index
        if flat["ready_wait_us"].any():
            starts = np.repeat(ops["start_ns"], np.maximum(batch.op["nflows"], 0))
            if len(starts) != len(flat):  # a malformed batch kept no flows
                starts = np.zeros(len(flat), dtype=np.int64)
            flat["rw_chunks"] = ready_wait_chunks(
                flat, hs.flows, starts, self.ready_wait_chunks
            )
        if tick >= hs.last_tick_ns or not hs.batches:
            hs.ops, hs.flows = ops, flat
        if len(flat):
            hs.keep_snapshot(tick, flat)
        while hs.history and tick - int(hs.history[0]["tick_ns"][0]) > self.history_ns:
            hs.history.popleft()
            hs.sends.popleft()

    def _fold_rc(self, idx: np.ndarray, rc: np.ndarray, tick: int, host: int) -> None:
        s = self.slots
        fresh = tick >= s["tick_ns"][idx]
        idx, rc = idx[fresh], rc[fresh]
        iss_up = rc["issued_seq"] > s["issued"][idx]
        done_up = rc["done_seq"] > s["done"][idx]
        s["issued_change_ns"][idx[iss_up]] = tick
        s["done_change_ns"][idx[done_up]] = tick
        s["issued"][idx] = np.maximum(s["issued"][idx], rc["issued_seq"])
        s["done"][idx] = np.maximum(s["done"][idx], rc["done_seq"])
        s["seen_ns"][idx] = np.maximum(s["seen_ns"][idx], rc["seen_ns"])
        s["tick_ns"][idx] = tick
        s["host"][idx] = host

    def _touch_host(self, hs: HostState, tick: int, now_ns: int) -> None:
        if hs.batches and tick > hs.last_tick_ns:
            gap = float(tick - hs.last_tick_ns)
            hs.gap_ns = gap if hs.gap_ns == 0 else 0.9 * hs.gap_ns + 0.1 * gap
        hs.batches += 1
        hs.last_tick_ns = max(hs.last_tick_ns, tick)
        hs.last_now_ns = max(hs.last_now_ns, now_ns)

    def touch(
        self, host: str, tick_ns: int, now_ns: int, nics: Sequence[NicPort] = ()
    ) -> None:
        """Record that ``host`` is alive (heartbeat).

        A heartbeat does not move the host's state position: heartbeats come
        on their own topic, which a worker may read seconds ahead of a backlog
        of state batches, and a position taken from them made rows look
        vanished, comms look stalled and fresh batches look stale. It only
        ages the host's slots once state batches stopped for
        ``BEAT_AHEAD_NS`` while the host still beats (see
        :meth:`host_tick_of_slots`).
        """
        hs = self.host(host)
        hs.last_now_ns = max(hs.last_now_ns, now_ns)
        hs.beat_tick_ns = max(hs.beat_tick_ns, tick_ns)
        self.ports.observe(host, tick_ns, nics)

    def ingest_completion(self, batch: CompletionBatch, now_ns: int) -> None:
        """Mark the sending host alive and keep its point-to-point transfer
        times; op rows are joined by the tracker."""
        hs = self.host(batch.header.host)
        hs.last_now_ns = max(hs.last_now_ns, now_ns)
        self.transfers.add(batch.op, batch.flow)

    def in_flight_ops(self) -> np.ndarray:
        """Return the latest in-flight op rows of every host (``_OP_PLUS``)."""
        parts = [h.ops for h in self.hosts.values() if len(h.ops)]
        return stack_rows(parts) if parts else np.zeros(0, dtype=_OP_PLUS)

    def latest_flows(self) -> np.ndarray:
        """Return the latest flow rows of every host (``FLAT_FLOW``)."""
        parts = [h.flows for h in self.hosts.values() if len(h.flows)]
        return stack_rows(parts) if parts else np.zeros(0, dtype=FLAT_FLOW)

    def flow_history(self, since_ns: int) -> np.ndarray:
        """Return every kept flow snapshot with ``tick_ns >= since_ns``."""
        # Every entry is one batch, its rows stamped with the batch's tick.
        parts = [
            f
            for h in self.hosts.values()
            for (tick, _), f in zip(h.sends, h.history, strict=True)
            if tick >= since_ns
        ]
        if not parts:
            return np.zeros(0, dtype=FLAT_FLOW)
        return stack_rows(parts)

    def host_tick_of_slots(self) -> np.ndarray:
        """Return, per slot, the latest tick of the slot's host (ns, host clock)."""
        ticks = np.array(
            [
                max(h.last_tick_ns, h.beat_tick_ns - BEAT_AHEAD_NS)
                for h in self.hosts.values()
            ],
            dtype=np.int64,
        )
        if not len(ticks):
            return np.zeros(len(self.slots), dtype=np.int64)
        out: np.ndarray = ticks[self.slots["host"]]
        return out
