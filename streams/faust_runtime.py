"""Pure runtime of the stream worker: job slots, clocks, snapshots, dedup, rates.

No Faust or Kafka imports: the Faust wiring in :mod:`mycroft.streams.app`
calls these, so they are tested without a broker or an event loop.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from mycroft.errors import DecodeError
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import (
    Anomaly,
    CommSummary,
    CompletionBatch,
    Heartbeat,
    Record,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.event_time import EventClock, Source
from mycroft.streams.core.rows import group_ids
from mycroft.streams.core.snapshot_codec import (
    Part,
    PartError,
    Sealed,
    Value,
    decode_snapshot,
    encode_snapshot,
    is_snapshot,
)
from mycroft.streams.core.snapshot_parts import (
    SIZING,
    PartSpec,
    analyzer_of,
    restore_any,
    snapshot_any,
)
from mycroft.streams.core.state_tree import decode_tree, encode_tree

Finding = Anomaly | RootCause  # noqa: UP040  # a plain alias keeps 3.11 tools happy
log = logging.getLogger(__name__)
MAX_ANOMALY_IDS = 2048


class Engine(Protocol):
    """What the worker needs of a per-job analyzer (``core.engine.Analyzer``)."""

    def ingest(self, record: Record, now_ns: int) -> None:
        """Fold one decoded record in."""

    def evaluate(self, now_ns: int) -> Sequence[Finding | CommSummary]:
        """Return new anomalies and root-cause revisions (or comm summaries)."""


EngineFactory = Callable[[str], Engine]


def record_job(record: Record) -> str:
    """Job id of an input record."""
    if isinstance(record, StateBatch | CompletionBatch):
        return record.header.job_id
    return record.job_id


def record_time_ns(record: Record) -> int:
    """Trace time of an input record (tick or timestamp), ns."""
    if isinstance(record, StateBatch | CompletionBatch):
        return record.header.tick_ns
    if isinstance(record, Heartbeat | Topology):
        return record.ts_ns
    if isinstance(record, CommSummary):
        return record.tick_ns
    return record.detected_ns


@dataclass
class JobSlot:
    """One job on this worker: its engine and its event clock.

    Records are pushed into the job's :class:`EventClock` as they are read
    and reach the engine in event-time order once the watermark passed them
    (``advance``), with evaluations every 100 ms of event time: the verdicts
    are those of ``mycroft analyze`` on the same records, whatever the read
    order and speed (``streams/core/event_time.py``). ``trace_ns`` is the
    newest record time read; ``anchor_s`` the wall time it was read at.
    ``seen_s`` is the wall time of the last record, whatever its trace time:
    a worker behind on one topic still reads a job's older completions after
    its state records reached the job's end, and the job is not idle then.
    ``produced_s``: the broker (create) time of the newest-produced record
    read for the job (None until one is read; not kept in snapshots).
    """

    job_id: str
    partition: int
    engine: Engine
    trace_ns: int = 0
    anchor_s: float = 0.0
    dirty: bool = True  # changed since its last snapshot
    seen_s: float = 0.0
    clock: EventClock = field(default_factory=EventClock)
    produced_s: float | None = None
    # (topic, partition) -> offset of the newest record taken in: kept in the
    # snapshot, so records a restart reads again are not taken in twice.
    taken: dict[tuple[str, int], int] = field(default_factory=dict)
    # host -> its newest topology record: what a snapshot of another release
    # still restores (``load_slot``).
    topology: dict[str, Topology] = field(default_factory=dict)

    def holds(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the record at ``offset`` is already in this slot's state
        (read again after a restart from a snapshot newer than the commit)."""
        return offset <= self.taken.get((topic, partition), -1)

    def took(self, topic: str, partition: int, offset: int) -> None:
        """Mark the record at ``offset`` as taken in."""
        key = (topic, partition)
        self.taken[key] = max(self.taken.get(key, -1), offset)

    def observe(self, trace_ns: int, wall_s: float) -> None:
        """Advance the newest trace time with a record's time seen at ``wall_s``."""
        if trace_ns > self.trace_ns:
            self.trace_ns, self.anchor_s = trace_ns, wall_s

    def ingest(self, record: Record, wall_s: float, produced_s: float = 0.0) -> None:
        """Buffer ``record`` in the job's event clock (produced at ``produced_s``,
        broker time; 0: unknown)."""
        t = record_time_ns(record)
        self.observe(t, wall_s)
        self.clock.push(record, t)
        if isinstance(record, Topology):
            self.topology[record.host] = record
        if produced_s > 0:
            self.produced_s = max(self.produced_s or 0.0, produced_s)
        self.dirty, self.seen_s = True, wall_s

    def advance(
        self,
        source: Callable[[str], Source],
        wall_s: float,
        max_evals: int = 0,
        out_of_time: Callable[[], bool] | None = None,
    ) -> list[Finding | CommSummary]:
        """Release what the watermark passed into the engine; return findings
        (``max_evals``, ``out_of_time``: see ``EventClock.advance``)."""
        idle = max(0.0, wall_s - self.seen_s) if self.seen_s else 0.0
        out: list[Finding | CommSummary] = self.clock.advance(
            self.engine, source, idle, max_evals, out_of_time
        )
        return out


def turns(
    slots: Sequence[JobSlot],
    out_of_time: Callable[[], bool],
    first: str | None = None,
) -> Iterator[JobSlot]:
    """The order in which a tick advances its jobs: in rounds, one step
    (``advance`` with an evaluation budget) per job per round, while some
    job still holds what its clock could release and time is left.

    The first round starts at job ``first`` (when it is there) and stops,
    like the others, once the time is out: with many jobs on a partition a
    tick may serve some of them only, and the next one starts with the
    first job this one did not serve (:func:`next_first`), so every job is
    served within a few ticks and none blocks the event loop. A job with a
    backlog (a flood, a worker catching up) gets no more turns than any
    other held job, so it cannot starve the jobs behind it. At least one
    step is taken per tick.
    """
    pending = list(slots)
    if first is not None:
        at = next((i for i, s in enumerate(pending) if s.job_id == first), 0)
        pending = pending[at:] + pending[:at]
    stepped = False
    while pending:
        for slot in pending:
            if stepped and out_of_time():
                return
            stepped = True
            yield slot
        pending = [s for s in pending if s.clock.held]


def next_first(
    slots: Sequence[JobSlot], served: set[str], first: str | None
) -> str | None:
    """The job the next tick's :func:`turns` starts with: the first one after
    ``first`` (in its rotated order) that this tick did not serve; None when
    every job was served."""
    ids = [s.job_id for s in slots]
    at = ids.index(first) if first in ids else 0
    return next((j for j in ids[at:] + ids[:at] if j not in served), None)


SLOT = PartSpec("slot", 1, "")
"""The slot's own part: its trace time, offsets taken in, topology records."""
TOPOLOGY_PARTS = frozenset({"topology", "gate", "engine"})
"""Engine parts that know the job's ranks: one rebuilt is fed the slot's
topology records again."""
CLOCK = PartSpec("clock", 1, "")
"""The job's event clock: the records read and not released yet."""


def dump_slot(slot: JobSlot) -> bytes:
    """Serialize a slot: its parts (``core/snapshot_parts.py``), zlib-compressed.

    The slot part holds the job's topology records as Avro bytes: a snapshot
    whose engine parts cannot be read still restores the ranks the job knows.
    """
    topology = [_codec().encode(t) for t in slot.topology.values()]
    own: dict[str, Value] = {
        "job_id": slot.job_id,
        "trace_ns": slot.trace_ns,
        "kind": f"{type(slot.engine).__module__}:{type(slot.engine).__qualname__}",
        "taken": encode_tree(slot.taken, {})["tree"],
        "topology": b"".join(struct.pack("<I", len(t)) + t for t in topology),
    }
    parts = [
        Part(SLOT.name, SLOT.version, own),
        Part(CLOCK.name, CLOCK.version, encode_tree(slot.clock, {})),
        *snapshot_any(slot.engine),
    ]
    return zlib.compress(encode_snapshot(parts), 1)


class StaleSnapshot(ValueError):
    """A snapshot this release cannot restore, with what of it it can read."""

    def __init__(self, why: str, topology: list[Topology]) -> None:
        super().__init__(why)
        self.topology = topology


def _codec() -> Codec:
    global _CODEC  # noqa: PLW0603 - built once, on first use (parses the schemas)
    if _CODEC is None:
        _CODEC = Codec()
    return _CODEC


_CODEC: Codec | None = None


MAX_MESSAGE_BYTES = 16 << 20
"""Largest record the worker produces (its producer's request size and the
snapshot topic's ``max.message.bytes``). A 1,024-rank job's engine snapshot
is ~8 MB compressed (``bench/results/snapshot_cost.json``)."""

SNAPSHOT_MAX_BYTES = MAX_MESSAGE_BYTES - (64 << 10)
"""Largest snapshot written: the rest is headroom for its key and framing."""


def dump_changed(
    slots: Iterable[JobSlot], limit: int = SNAPSHOT_MAX_BYTES
) -> tuple[dict[str, bytes], dict[str, int]]:
    """Snapshots of the slots changed since their last one, and the size of
    each snapshot over ``limit``, which is not returned and whose slot stays
    changed (a record over the producer's limit would stop the worker)."""
    blobs: dict[str, bytes] = {}
    too_big: dict[str, int] = {}
    for slot in slots:
        if not slot.dirty:
            continue
        blob = dump_slot(slot)
        if len(blob) > limit:
            too_big[slot.job_id] = len(blob)
            continue
        blobs[slot.job_id] = blob
        slot.dirty = False
    return blobs, too_big


def load_slot(
    blob: bytes,
    partition: int,
    wall_s: float,
    config: DetectorConfig | None = None,
    factory: EngineFactory | None = None,
) -> tuple[JobSlot, set[str]]:
    """Rebuild a slot from :func:`dump_slot` bytes; its clock restarts at ``wall_s``.

    Its engine is a new one of ``factory`` (None: of the snapshot's engine
    class, an analyzer built with ``config``) restored from its parts, and
    takes on ``config`` where it can (``core/snapshot_parts.py``); a part
    that does not restore is rebuilt empty alone, logged. Also returns the
    detector keys that kept the snapshot's values.

    Raises:
        StaleSnapshot: a pickled snapshot of an older release (never
            unpickled), or one whose slot part does not read.
    """
    data = zlib.decompress(blob)
    if not is_snapshot(data):
        raise StaleSnapshot(
            "snapshot in the pickled format of an older release, not read", []
        )
    parts = {p.name: p for p in decode_snapshot(data)}
    own = _slot_part(parts.get(SLOT.name))
    job_id, topology = str(own["job_id"]), _topology(_frames(own["topology"]))
    kind = str(own["kind"])
    try:
        fresh = factory(job_id) if factory else analyzer_of(kind, job_id, config)
    except PartError as exc:
        raise StaleSnapshot(str(exc), topology) from exc
    restored = restore_any(job_id, fresh, list(parts.values()), config)
    if restored.lost.keys() & TOPOLOGY_PARTS:
        for t in topology:  # what the job's rebuilt topology knew
            restored.engine.ingest(t, t.ts_ns)
    # Seen at the restore: a job whose last records the snapshot already
    # held gets no record to date it, and would never turn quiet (nor be
    # evaluated once more, as at the end of its trace).
    slot = JobSlot(job_id, partition, restored.engine, int(own["trace_ns"]), wall_s)  # type: ignore[arg-type]
    slot.clock = _clock(parts.get(CLOCK.name), job_id)
    slot.taken, slot.seen_s = decode_tree({"tree": own["taken"]}, {}), wall_s
    slot.topology = {t.host: t for t in topology}
    return slot, restored.kept


def _slot_part(sealed: Sealed | None) -> dict[str, Value]:
    """The slot part's values (raises :class:`StaleSnapshot` without them)."""
    if sealed is None or sealed.version != SLOT.version:
        raise StaleSnapshot("snapshot without a slot part this release reads", [])
    try:
        return sealed.open().fields
    except PartError as exc:
        raise StaleSnapshot(f"snapshot slot part does not decode: {exc}", []) from exc


def _clock(sealed: Sealed | None, job_id: str) -> EventClock:
    """The restored event clock, or a new one (logged: its records are lost)."""
    why = "not in the snapshot"
    if sealed is not None and sealed.version == CLOCK.version:
        try:
            clock: EventClock = decode_tree(sealed.open().fields, {})
            return clock
        except PartError as exc:
            why = f"does not decode: {exc}"
    elif sealed is not None:
        why = f"part version {sealed.version}, this release reads {CLOCK.version}"
    log.warning(
        "job %s: snapshot part 'clock' rebuilt empty (%s): the records it "
        "buffered are lost",
        job_id,
        why,
    )
    return EventClock()


def _frames(data: Value) -> list[bytes]:
    """Split length-prefixed frames."""
    out, at = [], 0
    raw = data if isinstance(data, bytes) else b""
    while at + 4 <= len(raw):
        (n,) = struct.unpack_from("<I", raw, at)
        out.append(raw[at + 4 : at + 4 + n])
        at += 4 + n
    return out


def _topology(blobs: list[bytes]) -> list[Topology]:
    """The topology records of a snapshot's outer layer that decode (one
    whose schema this release does not know is left out, and logged)."""
    out: list[Topology] = []
    for b in blobs:
        try:
            record = _codec().decode(b)
        except DecodeError as exc:
            log.warning("a topology record of a snapshot does not decode: %s", exc)
            continue
        if isinstance(record, Topology):
            out.append(record)
    return out


@dataclass
class JobRouter:
    """Job id -> slot, grouped by partition; creates engines on first sight."""

    factory: EngineFactory
    config: DetectorConfig | None = None  # restored engines take it on
    slots: dict[str, JobSlot] = field(default_factory=dict)
    loaded: set[int] = field(default_factory=set)

    def slot(self, job_id: str, partition: int) -> JobSlot:
        """The job's slot, created empty when new."""
        slot = self.slots.get(job_id)
        if slot is None:
            slot = JobSlot(job_id, partition, self.factory(job_id))
            self.slots[job_id] = slot
        return slot

    def on_partition(self, partition: int) -> list[JobSlot]:
        """Slots of the jobs on ``partition``."""
        return [s for s in self.slots.values() if s.partition == partition]

    def restore(
        self, blobs: Iterable[tuple[str, bytes]], partition: int, wall_s: float
    ) -> int:
        """Load snapshots of ``partition`` (once per assignment); return how many."""
        if partition in self.loaded:
            return 0
        self.loaded.add(partition)
        n = 0
        for job_id, blob in blobs:
            if job_id in self.slots:
                continue
            try:
                slot, kept = load_slot(
                    blob, partition, wall_s, self.config, self.factory
                )
            except StaleSnapshot as stale:
                self.slots[job_id] = self._afresh(job_id, partition, wall_s, stale)
                n += 1
                continue
            except (
                ValueError,
                zlib.error,
            ) as exc:
                # Unreadable: the job starts afresh from the records read next.
                log.warning("snapshot of job %s not restored (%s)", job_id, exc)
                continue
            if kept:
                log.warning(
                    "job %s restored with its own detector config: it was "
                    "created with other baseline sizes (%s); it keeps its %s "
                    "until it ends (new jobs take the current ones), and takes "
                    "the current root-cause scoring",
                    job_id,
                    ", ".join(k for k in SIZING if k in kept),
                    ", ".join(sorted(kept)),
                )
            self.slots[job_id] = slot
            n += 1
        return n

    def _afresh(
        self, job_id: str, partition: int, wall_s: float, stale: StaleSnapshot
    ) -> JobSlot:
        """A new slot for a job whose snapshot another release wrote, fed the
        topology records it held: the records read next (from the committed
        offsets, long past the job's topology on its compacted topic) are
        then of ranks it knows, and only its baselines warm up again."""
        slot = JobSlot(job_id, partition, self.factory(job_id))
        for t in stale.topology:
            slot.ingest(t, wall_s)
        log.warning(
            "job %s: %s; it starts afresh from the %d host topology record(s) "
            "the snapshot held (its baselines warm up again, open incidents "
            "are not carried over)",
            job_id,
            stale,
            len(stale.topology),
        )
        return slot

    def evict_idle(self, partition: int, wall_s: float, idle_s: float) -> list[str]:
        """Forget the jobs of ``partition`` without a record for ``idle_s``;
        return their ids.

        A record that does not advance the job's clock counts too: evicting
        a job whose older records still arrive restarts it from nothing,
        without its topology, and its completions never join.
        """
        gone = [
            j
            for j, s in self.slots.items()
            if s.partition == partition and wall_s - max(s.anchor_s, s.seen_s) > idle_s
        ]
        for job_id in gone:
            del self.slots[job_id]
        return gone

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget revoked partitions: their jobs reload from snapshots if returned."""
        gone = set(partitions)
        self.loaded -= gone
        self.slots = {j: s for j, s in self.slots.items() if s.partition not in gone}


def is_fresh(state: Mapping[str, Any] | None, finding: Finding) -> bool:
    """Whether ``finding`` was not sent yet, given a job's ``emitted`` state.

    A root cause is fresh when its revision is above the last one sent for its
    incident; an anomaly when its id was never sent. This makes replay after a
    crash idempotent: exactly-once effect on (incident_id, revision).
    """
    state = state or {}
    if isinstance(finding, RootCause):
        last = state.get("incidents", {}).get(finding.incident_id, -1)
        return bool(finding.revision > last)
    return finding.anomaly_id not in state.get("anomalies", ())


def mark_sent(state: Mapping[str, Any] | None, finding: Finding) -> dict[str, Any]:
    """Return a new ``emitted`` state (JSON-able) that includes ``finding``."""
    state = state or {}
    incidents = dict(state.get("incidents", {}))
    anomalies = list(state.get("anomalies", ()))
    if isinstance(finding, RootCause):
        incidents[finding.incident_id] = max(
            finding.revision, incidents.get(finding.incident_id, -1)
        )
    elif finding.anomaly_id not in anomalies:
        anomalies = [*anomalies, finding.anomaly_id][-MAX_ANOMALY_IDS:]
    return {"incidents": incidents, "anomalies": anomalies}


def rank_chunks(batches: Sequence[CompletionBatch]) -> dict[int, int]:
    """Chunks moved per rank by the ops completed in ``batches`` (a batch
    whose ops do not account for its flows is left out, and so are the rows
    of a negative rank: rates are read at intake, before the record gate)."""
    full = [b for b in batches if len(b.op) and len(b.flow)]
    if not full:
        return {}
    at = np.cumsum([0] + [len(b.op) for b in full[:-1]])
    nflows = np.concatenate([b.op["nflows"] for b in full]).astype(np.int64)
    sane = (np.minimum.reduceat(nflows, at) >= 0) & (
        np.add.reduceat(nflows, at) == [len(b.flow) for b in full]
    )
    ok = [b for b, good in zip(full, sane.tolist(), strict=True) if good]
    if not ok:
        return {}
    op = np.concatenate([b.op[["rank", "nflows"]] for b in ok])
    ranks = np.repeat(op["rank"], op["nflows"])
    chunks = np.concatenate([b.flow["chunks"] for b in ok]).astype(np.float64)
    if (ranks < 0).any():
        ranks, chunks = ranks[ranks >= 0], chunks[ranks >= 0]
        if not len(ranks):
            return {}
    totals = np.bincount(ranks, weights=chunks)
    present = np.unique(ranks)
    moved = totals[present].astype(np.int64)
    return dict(zip(present.tolist(), moved.tolist(), strict=True))


def add_counts(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """Sum two ``name -> count`` maps: a rate table's window value and the
    increments of one step (string names: the values travel as JSON)."""
    out = dict(total)
    for name, n in more.items():
        out[name] = out.get(name, 0) + n
    return out


def comm_ops(batches: Sequence[CompletionBatch]) -> dict[int, int]:
    """Distinct ops completed per communicator, counted per batch (each
    host's view) and summed over ``batches``."""
    ops = [b.op for b in batches if len(b.op)]
    if not ops:
        return {}
    source = np.repeat(np.arange(len(ops)), [len(o) for o in ops])
    op = np.concatenate([o[["comm", "seq"]] for o in ops])
    # group_ids, not np.unique(axis=1): 5x faster.
    _, first = group_ids(source, op["comm"], op["seq"])
    comms, counts = np.unique(op["comm"][first], return_counts=True)
    return dict(zip(comms.tolist(), counts.tolist(), strict=True))
