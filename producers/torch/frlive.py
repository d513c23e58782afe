"""Polling the Flight Recorder's live buffer of this process on the tracer's tick.

The Python wrappers see only the collectives called from Python; DDP's bucket
all-reduces, its construction-time broadcasts and other C++-issued ops reach
the backend directly. The Flight Recorder (FR) records every collective a
process group runs, whoever issued it, so :class:`FrPoller` reads it and
writes the ops the wrappers did not see.

Per tick (``Tracer.beat_s``, on the tracer's poll thread) it reads the FR
*header* (``pg_status`` only, ~10 us): the newest enqueued and completed
collective of each group (keyed by an id the entries map to the group's
name). Only when a group has enqueued a collective this rank has not
recorded yet does it read the entries (cost grows with the ring: ~5 us per
entry to dump, ~2 to decode), at most every ``full_period_s`` (default 0:
every tick) unless the unread entries reach half of ``capacity``. Entries
are taken incrementally by ``record_id``; a gap in record ids (the ring
wrapped between reads) is counted in ``stats.lost`` and reported as dropped
ops in the beat. Entries already in the recorder when polling starts are
skipped.

Numbering: an op of group ``g`` is ``(comm_hash(g), collective_seq_id - 1)``,
the same on every rank and the same the wrappers use while the poller runs
(``CommRef.next_seq``), so a wrapped op is recognised by its (group, sequence)
and never written twice. Completion: an entry the FR shows finished
(``time_discovered_completed_ns`` on NCCL, else ``retired`` or the group's
``last_completed_collective``) is written as OP_DONE, at the FR's completion
time when it has one, else at the poll time (one tick of resolution).

Torch-free: the dump functions and the group lookup are handed in.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mycroft.producers.ring_layout import DTYPES
from mycroft.producers.torch.frdump import nbytes
from mycroft.producers.torch.frops import op_kind, op_name
from mycroft.producers.torch.tracer import CommRef, Tracer

log = logging.getLogger(__name__)

DEFAULT_FR_ENTRIES = 128
"""``TORCH_FR_BUFFER_SIZE`` the tracer asks for when it is unset (torch's
default is 2000). A read costs ~7 us per entry of the ring (dump and decode,
GIL held), so 128 entries read every 100 ms tick cost < 1 ms per tick, and
up to ~1,200 collectives a second are read before the ring wraps."""
DEFAULT_FULL_PERIOD_S = 0.0
"""Shortest wait between two entry reads while unrecorded ops exist (0: every
tick). Longer waits lag the C++-issued ops of each rank by up to the wait,
differently on every rank; a 0.5 s wait made a healthy rank look late to the
hang detector in a DDP straggler run."""

_FR_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Char": "int8",
    "Byte": "uint8",
    "Short": "int16",
    "Int": "int32",
    "Long": "int64",
    "Bool": "bool",
}
_DTYPE_CODE = {name: i for i, name in enumerate(DTYPES)}


@dataclass(frozen=True)
class FrConfig:
    """How the tracer polls the Flight Recorder (``capacity`` 0: not at all).

    ``capacity`` is the FR ring's size in entries (``TORCH_FR_BUFFER_SIZE``).
    """

    capacity: int = DEFAULT_FR_ENTRIES
    full_period_s: float = DEFAULT_FULL_PERIOD_S


Dump = Callable[[bool], bytes]
"""``dump(include_entries) -> pickle bytes`` of one recorder (no stacks)."""


@dataclass(frozen=True)
class FrOp:
    """One FR entry as the ring needs it (``seq`` from 0)."""

    pg: str
    seq: int
    kind: int
    nbytes: int
    dtype: int
    created_ns: int
    started_ns: int
    completed_ns: int
    retired: bool


def fr_op(entry: dict[str, Any]) -> FrOp | None:
    """Map one FR entry dict (pickle or JSON dump) to an op; None for p2p.

    Sizes are bytes of the inputs (``input_sizes`` x element size of
    ``input_dtypes``); times are wall-clock epoch ns, 0 when the FR has none
    (gloo never fills start or completion).
    """
    if entry.get("is_p2p"):
        return None
    dtypes = entry.get("input_dtypes") or [""]
    name = _FR_DTYPES.get(str(dtypes[0]), "other" if dtypes[0] else "unknown")
    pg = entry.get("process_group") or ("", "")
    sizes = list(entry.get("input_sizes") or [])
    return FrOp(
        str(pg[0]),
        int(entry.get("collective_seq_id", 0)) - 1,
        op_kind(op_name(entry.get("profiling_name"))),
        int(nbytes(sizes, list(entry.get("input_dtypes") or []))),
        _DTYPE_CODE[name],
        int(entry.get("time_created_ns") or 0),
        int(entry.get("time_discovered_started_ns") or 0),
        int(entry.get("time_discovered_completed_ns") or 0),
        bool(entry.get("retired", False)),
    )


@dataclass
class FrStats:
    """What the poller did; times are CPU time of the polling thread, in ns
    (wall time would count the waits for the GIL the training thread holds)."""

    polls: int = 0
    reads: int = 0
    entries: int = 0
    emitted: int = 0
    done: int = 0
    deduped: int = 0
    mismatched: int = 0
    """Wrapped ops whose FR entry at the same number has other bytes."""
    lost: int = 0
    errors: int = 0
    poll_ns_total: int = 0
    poll_ns_max: int = 0
    read_ns_total: int = 0
    last_error: str = ""
    poll_ns: list[int] = field(default_factory=list)

    def record(self, ns: int, read: bool) -> None:
        """Account one poll that took ``ns`` (``read``: it read entries)."""
        self.polls += 1
        self.poll_ns_total += ns
        self.poll_ns_max = max(self.poll_ns_max, ns)
        if read:
            self.read_ns_total += ns
        if len(self.poll_ns) < 4096:  # bounded sample for the bench
            self.poll_ns.append(ns)


def _load(data: bytes) -> dict[str, Any]:
    # The bytes come from this process's own recorder, not from a file.
    doc = pickle.loads(data)  # noqa: S301 - in-process data, see above
    return doc if isinstance(doc, dict) else {}


@dataclass
class _Source:
    dump: Dump
    last_rid: int = -1


class FrPoller:
    """Writes the FR's collectives the wrappers did not record.

    Args:
        tracer: the ring writer (``issued`` / ``done``).
        dumps: one dump function per recorder (gloo/CPU, NCCL).
        resolve: group name -> its ``CommRef`` (registers it), None if this
            rank is not a member or the group is unknown.
        capacity: the FR ring's entries (``TORCH_FR_BUFFER_SIZE``).
        full_period_s: shortest wait between entry reads while unrecorded
            ops exist.
        clock_ns: wall clock (tests hand in their own).
    """

    def __init__(  # noqa: PLR0913, PLR0917 - wiring of one object
        self,
        tracer: Tracer,
        dumps: list[Dump],
        resolve: Callable[[str], CommRef | None],
        capacity: int = DEFAULT_FR_ENTRIES,
        full_period_s: float = DEFAULT_FULL_PERIOD_S,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.tracer, self.resolve = tracer, resolve
        self.sources = [_Source(d) for d in dumps]
        self.capacity = max(1, capacity)
        self.full_period_ns = int(full_period_s * 1e9)
        self.clock_ns = clock_ns
        self.stats = FrStats()
        self._last_read_ns = 0
        self._pending: dict[int, dict[int, int]] = {}  # comm -> seq -> start
        self._refs: dict[str, CommRef] = {}
        self.paused = False
        self._force = False
        self._pg_names: dict[str, str] = {}  # pg_status id -> group name
        self._active: dict[str, str] = {}  # group name -> its newest id
        self._ignored: set[str] = set()

    # -- start, pause ----------------------------------------------------------
    def start(self) -> None:
        """Skip what the recorder holds already (earlier groups of this process)."""
        try:
            for src in self.sources:
                entries = _load(src.dump(True)).get("entries") or []
                for e in entries:
                    self._learn(e)
                rids = [int(e.get("record_id", -1)) for e in entries]
                src.last_rid = max([src.last_rid, *rids])
        except Exception as exc:  # never break the training job
            log.warning("mycroft: Flight Recorder not readable: %s", exc)

    def pause(self) -> None:
        """Stop polling; the ops run until :meth:`resume` are never written."""
        self.paused = True

    def resume(self) -> None:
        """Poll again from now on: skip what ran while paused."""
        self.start()
        try:
            status, _unknown = self._status()
        except Exception as exc:  # never break the training job
            log.warning("mycroft: Flight Recorder not readable: %s", exc)
            status = {}
        for name, (enqueued, _done) in status.items():
            ref = self._ref(name)
            if ref is not None:
                ref.skip_to(_collectives(ref, enqueued))
        self.paused = False

    def _learn(self, entry: dict[str, Any]) -> None:
        """Which group an id of ``pg_status`` is: the entries say (the newest
        group of a name wins; ids of destroyed groups stay in the status)."""
        pid, pg = str(entry.get("pg_id", "")), entry.get("process_group") or ("",)
        name = str(pg[0])
        self._pg_names[pid] = name
        active = self._active.get(name)
        if active is None or _as_int(pid) > _as_int(active):
            self._active[name] = pid

    def _status(self) -> tuple[dict[str, tuple[int, int]], set[str]]:
        """(enqueued, completed) per group name, and the ids not known yet."""
        status: dict[str, tuple[int, int]] = {}
        unknown: set[str] = set()
        for src in self.sources:
            for pid, st in (_load(src.dump(False)).get("pg_status") or {}).items():
                enq = int(st.get("last_enqueued_collective", 0))
                done = int(st.get("last_completed_collective", 0))
                name = self._pg_names.get(str(pid))
                if name is None:
                    if enq > 0 and str(pid) not in self._ignored:
                        unknown.add(str(pid))
                elif self._active.get(name) == str(pid):
                    had = status.get(name, (0, 0))
                    status[name] = (max(had[0], enq), max(had[1], done))
        return status, unknown

    # -- per tick ------------------------------------------------------------
    def flush(self) -> None:
        """Read the entries now, whatever the period (before a group goes away)."""
        self._last_read_ns, self._force = 0, True
        self.poll()
        self._force = False

    def poll(self) -> None:
        """One tick: read headers, entries when needed, write ops. Never raises."""
        if self.paused:
            return
        t0 = time.thread_time_ns()
        read = False
        try:
            read = self._poll(self.clock_ns())
        except Exception as exc:  # never break the poll thread
            self.stats.errors += 1
            if not self.stats.last_error:
                log.warning("mycroft: Flight Recorder poll failed: %s", exc)
            self.stats.last_error = str(exc)
        self.stats.record(time.thread_time_ns() - t0, read)

    def _poll(self, now_ns: int) -> bool:
        status, unknown = self._status()
        unread = self._unread(status) + len(unknown)
        read = (
            self._force
            or unread > 0
            and (
                now_ns - self._last_read_ns >= self.full_period_ns
                or unread >= self.capacity // 2
            )
        )
        if read:
            self._last_read_ns = now_ns
            for src in self.sources:
                self._read(src, now_ns)
            # ids still without entries: their ops were overwritten or predate us
            self._ignored |= {p for p in unknown if p not in self._pg_names}
        self._complete(status, now_ns)
        return read

    def _ref(self, pg: str) -> CommRef | None:
        ref = self._refs.get(pg)
        if ref is None:  # not cached: a group may be looked up before it exists
            ref = self.resolve(pg)
            if ref is not None:
                self._refs[pg] = ref
        return ref

    def _unread(self, status: dict[str, tuple[int, int]]) -> int:
        """Collectives enqueued but neither wrapped nor written yet."""
        total = 0
        for pg, (enqueued, _done) in status.items():
            ref = self._ref(pg)
            if ref is not None:
                ref.advance()
                total += max(0, _collectives(ref, enqueued) - ref.known)
        return total

    # -- entries -------------------------------------------------------------
    def _read(self, src: _Source, now_ns: int) -> None:
        self.stats.reads += 1
        entries = _load(src.dump(True)).get("entries") or []
        fresh = [e for e in entries if int(e.get("record_id", -1)) > src.last_rid]
        if not fresh:
            return
        first = min(int(e["record_id"]) for e in fresh)
        self.stats.lost += max(0, first - src.last_rid - 1)
        src.last_rid = max(int(e["record_id"]) for e in fresh)
        self.stats.entries += len(fresh)
        lowest: dict[str, int] = {}
        for e in sorted(fresh, key=lambda x: int(x["record_id"])):
            self._learn(e)
            op = fr_op(e)
            if op is not None and op.seq >= 0:
                lowest.setdefault(op.pg, op.seq)
                self._write(op, now_ns)
        for pg, seq in lowest.items():  # older ones of the group were lost
            ref = self._ref(pg)
            if ref is not None:
                ref.skip_to(seq)
                ref.advance()

    def _write(self, op: FrOp, now_ns: int) -> None:
        ref = self._ref(op.pg)
        if ref is None:
            return
        if op.seq < ref.known or op.seq in ref.wrapped:
            self.stats.deduped += 1
            wrapped_bytes = ref.wrapped.get(op.seq, op.nbytes)
            if wrapped_bytes != op.nbytes:  # numbering out of step with torch's
                self.stats.mismatched += 1
            return
        ref.wrapped[op.seq] = op.nbytes
        start = op.started_ns or op.created_ns
        self.tracer.issued(
            op.created_ns, ref.comm, op.seq, op.nbytes, op.kind, op.dtype
        )
        self.stats.emitted += 1
        if ref.gpu_done:  # its completion comes from the GPU (``nccl_done``)
            return
        if op.completed_ns or op.retired:
            self.tracer.done(op.completed_ns or now_ns, ref.comm, op.seq, start)
            self.stats.done += 1
        else:
            self._pending.setdefault(ref.comm, {})[op.seq] = start

    def _complete(self, status: dict[str, tuple[int, int]], now_ns: int) -> None:
        """OP_DONE for written ops the group's status shows completed."""
        for pg, (_enq, count) in status.items():
            ref = self._ref(pg)
            pend = self._pending.get(ref.comm) if ref is not None else None
            if ref is None or not pend:
                continue
            completed = _collectives(ref, count)
            for seq in [s for s in pend if s < completed]:
                self.tracer.done(now_ns, ref.comm, seq, pend.pop(seq))
                self.stats.done += 1


def _as_int(text: str) -> int:
    return int(text) if text.isdigit() else -1


def _collectives(ref: CommRef, count: int) -> int:
    """A ``pg_status`` count as collectives (gloo counts point-to-point too)."""
    return count - ref.p2p_calls if ref.counts_p2p else count


def recorder_dumps(c10d: Any, nccl: bool) -> list[Dump]:
    """The dump functions of this torch build: the generic (CPU/gloo) recorder,
    and the NCCL one when ``nccl`` and the build has it (a separate ring)."""
    out: list[Dump] = []
    names = ("_dump_fr_trace", "_dump_nccl_trace") if nccl else ("_dump_fr_trace",)
    for name in names:
        fn = getattr(c10d, name, None)
        if fn is not None:
            out.append(_bind(fn))
    return out


def _bind(fn: Callable[..., bytes]) -> Dump:
    def dump(include_entries: bool) -> bytes:
        return fn(include_entries, False, False)

    return dump
