"""The torch-free half of the tracer: communicator ids, the ring, the liveness beat.

:class:`Tracer` owns one ring per training process (``schemas/ring.md``,
layout version 2) and writes, per op, an OP_ISSUED record before the op is
handed to the backend and an OP_DONE record once it completed on this rank.
A daemon thread writes a BEAT every ``beat_s`` so that a process that dies or
freezes shows up as a stale ``seen_ns`` at the agent. Writes never wait on
the agent or on I/O: the ring overwrites its oldest slot when full. The only
shared lock is the ring's, held for one 64-byte slot write (~2 us).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mycroft.producers.ring import DEFAULT_NSLOTS, RingWriter
from mycroft.producers.ring_layout import (
    Beat,
    Comm,
    RingRecord,
    comm_name_record,
    comm_ranks_records,
    job_id_from_env,
)

log = logging.getLogger(__name__)

DEFAULT_RING_DIR = "/dev/shm/mycroft"  # noqa: S108 - the agent's default ring dir


def comm_hash(group_name: str) -> int:
    """A u64 communicator id every rank derives alike from the group's name.

    torch names process groups deterministically (``"0"`` for the default
    group, then a counter in creation order, or the name the user gave), and
    every member creates its groups in the same order, so all ranks agree.
    The Flight Recorder import uses the same function on the dump's names.
    """
    digest = hashlib.blake2b(f"torch-pg:{group_name}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") or 1


def p2p_hash(group_name: str, src: int, dst: int) -> int:
    """The virtual communicator of point-to-point ops from ``src`` to ``dst``."""
    return comm_hash(f"{group_name}:p2p:{src}->{dst}")


@dataclass
class CommRef:
    """One communicator as this rank sees it: id, members, next op number.

    ``seq`` counts the ops the wrappers took. With the Flight Recorder polled,
    a collective's number is instead the backend's (``collective_seq_id - 1``,
    see :meth:`next_seq`); ``wrapped`` maps the numbers already written to
    their bytes and ``known`` counts the leading numbers written (so
    ``wrapped`` stays small).
    """

    comm: int
    ranks: tuple[int, ...]
    name: str
    seq: int = 0
    written: bool = False
    pg: Any = None
    p2p_calls: int = 0
    counts_p2p: bool = False
    wrapped: dict[int, int] = field(default_factory=dict)
    known: int = 0
    backend_seq: Callable[[], int] | None = None
    gpu_done: bool = False
    """Completions come from the GPU (``nccl_done``): no other OP_DONE."""

    def next_seq(self) -> int:
        """The number of the collective about to be issued on this group.

        The backend's count of ops issued so far, less the point-to-point
        ones where it counts those too (gloo), else the wrappers' own count.
        """
        if self.backend_seq is None:
            return self.seq
        return int(self.backend_seq()) - self.p2p_calls

    def advance(self) -> None:
        """Move ``known`` past the leading numbers already written."""
        wrapped = self.wrapped
        while self.known in wrapped:
            del wrapped[self.known]
            self.known += 1
        if len(wrapped) > 4096:  # numbers never filled in (lost): forget them
            self.skip_to(max(wrapped) + 1)

    def skip_to(self, seq: int) -> None:
        """Give up on the numbers below ``seq`` not written yet (lost)."""
        if seq > self.known:
            self.known = seq
            self.wrapped = {s: n for s, n in self.wrapped.items() if s >= seq}
            self.advance()


@dataclass
class TracerStats:
    """What the tracer did (for tests and the bench)."""

    issued: int = 0
    done: int = 0
    beats: int = 0
    comms: int = 0
    errors: list[str] = field(default_factory=list)


class Tracer:
    """Writes the op and liveness records of one training process.

    Args:
        ring_dir: folder the node agent reads (``mycroft agent --ring-dir``).
        nslots: ring slots (64 bytes each); 64 Ki = 4 MiB.
        beat_s: liveness period, seconds.
        unlink_at_exit: remove the ring file in :meth:`close` (a crashed
            process leaves it, so the agent sees the rank go silent).

    The ring is created by :meth:`open` once the rank is known.
    """

    def __init__(
        self,
        ring_dir: Path | str = DEFAULT_RING_DIR,
        nslots: int = DEFAULT_NSLOTS,
        beat_s: float = 0.1,
        unlink_at_exit: bool = True,
    ) -> None:
        self.ring_dir = Path(ring_dir)
        self.nslots, self.beat_s = nslots, beat_s
        self.unlink_at_exit = unlink_at_exit
        self.ring: RingWriter | None = None
        self.rank = -1
        self.stats = TracerStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._ticker: threading.Thread | None = None
        self.on_tick: Callable[[], None] | None = None
        """Called every beat period from a thread of its own (the Flight
        Recorder poll): a call into torch that blocks (a recorder dump
        waiting on a hung group) must not stop the liveness beat."""
        self.dropped_ops: Callable[[], int] = lambda: 0
        """Ops known to be missing from the ring (reported in every BEAT)."""

    def open(self, rank: int, local_rank: int = -1) -> None:
        """Create this process's ring, start the beat and poll threads (idempotent)."""
        if self.ring is not None:
            return
        self.ring_dir.mkdir(parents=True, exist_ok=True)
        path = self.ring_dir / f"torch-r{rank}-p{os.getpid()}.ring"
        self.ring = RingWriter(
            path, rank, self.nslots, local_rank, version=4, job_id=job_id_from_env()
        )
        self.rank = rank
        self._beat = threading.Thread(
            target=self._beat_loop, name="mycroft-beat", daemon=True
        )
        self._beat.start()
        self._ticker = threading.Thread(
            target=self._tick_loop, name="mycroft-poll", daemon=True
        )
        self._ticker.start()
        log.info("mycroft: tracing rank %d into %s", rank, path)

    def register(self, ref: CommRef, comm_rank: int) -> None:
        """Write COMM, COMM_NAME and COMM_RANKS for ``ref`` once."""
        if self.ring is None or ref.written:
            return
        ref.written = True
        now = time.time_ns()
        records: list[RingRecord] = [
            Comm(now, ref.comm, len(ref.ranks), comm_rank, 0, -1),
            comm_name_record(now, ref.comm, ref.name),
            *comm_ranks_records(now, ref.comm, ref.ranks),
        ]
        with self._lock:
            ring = self.ring
            if ring is None:
                return
            for rec in records:
                ring.write(rec)
        self.stats.comms += 1

    def issued(  # noqa: PLR0917 - the hot path: positional is cheapest
        self, ts_ns: int, comm: int, seq: int, nbytes: int, kind: int, dtype: int
    ) -> None:
        """OP_ISSUED: written before the op reaches the backend."""
        with self._lock:
            ring = self.ring
            if ring is None:
                return
            ring.op_issued(ts_ns, comm, seq, nbytes, kind, dtype)
        self.stats.issued += 1

    def done(self, ts_ns: int, comm: int, seq: int, start_ns: int) -> None:
        """OP_DONE: the op completed on this rank (``start_ns``: when it started)."""
        with self._lock:
            ring = self.ring
            if ring is None:
                return
            ring.op_done(ts_ns, comm, seq, start_ns)
        self.stats.done += 1

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.beat_s):
            tick = self.on_tick
            if tick is not None:
                tick()

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.beat_s):
            lost = self.dropped_ops()
            beat = Beat(time.time_ns(), self.stats.issued, dropped_ops=lost)
            with self._lock:
                ring = self.ring
                if ring is None:
                    return
                ring.write(beat)
            self.stats.beats += 1

    def close(self) -> None:
        """Stop the beat; unmap (and unless kept, remove) the ring."""
        self._stop.set()
        for thread in (self._beat, self._ticker):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=2 * self.beat_s + 1)
        with self._lock:
            ring, self.ring = self.ring, None
            if ring is not None:
                ring.close(unlink=self.unlink_at_exit)
