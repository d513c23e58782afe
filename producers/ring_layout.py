"""Binary layout of the shared-memory trace ring (``schemas/ring.md`` is normative).

A ring file is a 128-byte header followed by ``nslots`` slots of 64 bytes.
Everything is little-endian. Slot ``n % nslots`` holds record number ``n``;
its sequence word is ``2n + 1`` while the writer fills it and ``2n + 2`` once
committed. The checksum is CRC-32 (zlib / ISO-HDLC) over all 64 slot bytes
as committed, with the checksum field (bytes 12..15) read as zero.

This module only packs and unpacks; :mod:`mycroft.producers.ring` maps files.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

MAGIC = b"MYCRING1"
VERSION = 1
"""Layout version a writer stamps by default (kinds 1..6)."""
VERSION_MAX = 4
"""Newest layout this module reads: version 2 adds kinds 7 and 8 (group membership),
version 3 kind 9 (the NCCL plugin's per-flow proxy-step counters), version 4 the
NCCL plugin's coverage counters in BEAT, OP_ISSUED ``func_seq`` and a send flow's
``ready_wait_us`` in FLOW_STEPS (all in bytes earlier versions reserve as zero)."""
COMM_RANKS_PER_SLOT = 6
"""Global ranks one COMM_RANKS record carries."""
COMM_NAME_BYTES = 32
DTYPES: tuple[str, ...] = (
    "unknown",
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "bool",
    "other",
    "uint32",
    "uint64",
    "float8e4m3",
    "float8e5m2",
)
"""Element types of OP_ISSUED byte 56 (append-only, like ``vocab``)."""
DTYPE_OTHER = DTYPES.index("other")
"""Code of an element type the list does not name."""
HEADER_SIZE = 128
SLOT_SIZE = 64
WRITE_IDX_OFFSET = 64
"""Byte offset of the u64 write index (own cache line)."""

HEADER = struct.Struct("<8sIIIIiiqi")
"""magic, version, header_size, slot_size, nslots, pid, rank, created_ns, local_rank."""
JOB_ID_OFFSET = 80
JOB_ID_BYTES = 48
"""The training job's id in header bytes 80..127 (version 4; zero before): UTF-8,
zero-padded; an id longer than 48 bytes is kept as its first 39 bytes, ``~`` and
the 8 hex digits of its FNV-1a 32-bit hash, as the C writer does."""

SLOT_HEAD = struct.Struct("<QBBHIq")
"""seq, kind, flags, reserved, crc32, ts_ns (bytes 0..23)."""

U64 = struct.Struct("<Q")


class Kind(IntEnum):
    """Record kinds (slot byte 8)."""

    COMM = 1
    OP_ISSUED = 2
    FLOW_PROGRESS = 3
    FLOW_DONE = 4
    OP_DONE = 5
    BEAT = 6
    COMM_RANKS = 7
    COMM_NAME = 8
    FLOW_STEPS = 9


PAYLOADS: dict[Kind, struct.Struct] = {
    # comm, nranks, comm_rank, nchannels, gpu, reserved
    Kind.COMM: struct.Struct("<Qiiii16x"),
    # comm, seq, bytes, kind, algo, proto, pad, nflows, dtype (v2), pad, func_seq (v4)
    Kind.OP_ISSUED: struct.Struct("<QqqBBBxiB3xI"),
    # comm, seq, channel, dir, pad, peer, total, gpu_ready, transmitted, done
    Kind.FLOW_PROGRESS: struct.Struct("<QqhBxiiiii"),
    # comm, seq, first_ns, channel, dir, pad, peer, chunks, wire_us (0: none)
    Kind.FLOW_DONE: struct.Struct("<QqqhBxiiI"),
    # comm, seq, start_ns, nflows, reserved
    Kind.OP_DONE: struct.Struct("<Qqqi12x"),
    # step, dropped comms/ops/flows, pxn_flows (v2; zero in v1),
    # unseen_ops, abandoned_ops, orphan_flows (v4; zero before), reserved
    Kind.BEAT: struct.Struct("<qIIIIIII4x"),
    # comm, nranks, first (index in the communicator), 6 global ranks (-1: none)
    Kind.COMM_RANKS: struct.Struct("<Qii6i"),
    # comm, name (UTF-8, zero-padded)
    Kind.COMM_NAME: struct.Struct("<Q32s"),
    # comm, seq, channel, dir, pad, peer, posted, received, bytes (v3)
    Kind.FLOW_STEPS: struct.Struct("<QqhBxiiiq"),
}
PAYLOAD_SIZE = SLOT_SIZE - SLOT_HEAD.size
if any(s.size != PAYLOAD_SIZE for s in PAYLOADS.values()):  # pragma: no cover
    raise RuntimeError("ring payload structs must be 40 bytes each")


@dataclass(frozen=True)
class RingHeader:
    """The decoded ring file header."""

    nslots: int
    pid: int
    rank: int
    created_ns: int
    local_rank: int = -1
    version: int = VERSION
    job_id: str = ""
    """The training job the writer belongs to ("": not known; version 4)."""

    def pack(self) -> bytes:
        """Bytes 0..63 of the file (the write index follows at 64)."""
        return HEADER.pack(
            MAGIC,
            self.version,
            HEADER_SIZE,
            SLOT_SIZE,
            self.nslots,
            self.pid,
            self.rank,
            self.created_ns,
            self.local_rank,
        ).ljust(WRITE_IDX_OFFSET, b"\0")

    def pack_job_id(self) -> bytes:
        """Bytes 80..127 of the file: the job id, zero-padded."""
        return job_id_field(self.job_id)

    @classmethod
    def unpack(cls, data: bytes) -> RingHeader:
        """Decode a header (bytes 0..127; the job id needs all of them); raise
        ValueError when it is not a Mycroft ring of a version this module reads."""
        magic, version, hsize, ssize, nslots, pid, rank, created, local = (
            HEADER.unpack_from(data)
        )
        if magic != MAGIC or not 1 <= version <= VERSION_MAX:
            raise ValueError(f"not a Mycroft ring (magic {magic!r}, version {version})")
        if hsize != HEADER_SIZE or ssize != SLOT_SIZE or nslots <= 0:
            raise ValueError(f"unsupported geometry {hsize}/{ssize}/{nslots}")
        raw = bytes(data[JOB_ID_OFFSET : JOB_ID_OFFSET + JOB_ID_BYTES])
        job = raw.rstrip(b"\0").decode("utf-8", "replace") if version >= 4 else ""
        return cls(nslots, pid, rank, created, local, version, job)


JOB_ID_ENV = (
    "MYCROFT_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "LSB_JOBID",
)
"""Where a training process finds its job id, first set wins (the NCCL plugin
reads the same list): Mycroft's own, then the launcher's. On Kubernetes set
``MYCROFT_JOB_ID`` from a pod label with the downward API."""


def job_id_from_env(env: Mapping[str, str] | None = None) -> str:
    """The training job's id from ``env`` (default ``os.environ``); "" if none."""
    env = os.environ if env is None else env
    return next((env[k] for k in JOB_ID_ENV if env.get(k)), "")


def job_id_field(job_id: str) -> bytes:
    """The 48 header bytes holding ``job_id`` (``JOB_ID_BYTES``)."""
    raw = job_id.encode("utf-8")
    if len(raw) > JOB_ID_BYTES:
        h = 0x811C9DC5
        for byte in raw:
            h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
        raw = raw[:39] + b"~" + f"{h:08x}".encode()
    return raw.ljust(JOB_ID_BYTES, b"\0")


@dataclass(frozen=True)
class Comm:
    """A communicator this rank joined."""

    ts_ns: int
    comm: int
    nranks: int
    comm_rank: int
    nchannels: int
    gpu: int


@dataclass(frozen=True)
class OpIssued:
    """An op enqueued by the framework (``ts_ns`` is the issue time)."""

    ts_ns: int
    comm: int
    seq: int
    nbytes: int
    kind: int
    algo: int
    proto: int
    nflows: int
    dtype: int = 0
    """Code into ``DTYPES`` of the input (0: unknown; version-1 writers leave 0)."""
    func_seq: int = 0
    """NCCL's own ``coll.seqNumber`` (low 32 bits), a counter per collective
    function, for matching NCCL's logs; ``seq`` is the op's identity (version 4;
    0 from other writers)."""


@dataclass(frozen=True)
class FlowProgress:
    """Cumulative chunk counters of one flow of one op at ``ts_ns``."""

    ts_ns: int
    comm: int
    seq: int
    channel: int
    direction: int
    peer: int
    total: int
    gpu_ready: int
    transmitted: int
    done: int


@dataclass(frozen=True)
class FlowDone:
    """One finished flow of an op: ``ts_ns`` is its last completion;
    ``wire_us`` a send's time on the network (0: not measured)."""

    ts_ns: int
    comm: int
    seq: int
    first_ns: int
    channel: int
    direction: int
    peer: int
    chunks: int
    wire_us: int = 0


@dataclass(frozen=True)
class OpDone:
    """An op completed (``ts_ns`` is the end time); its FLOW_DONE records precede it."""

    ts_ns: int
    comm: int
    seq: int
    start_ns: int
    nflows: int


@dataclass(frozen=True)
class Beat:
    """Liveness of the writing process."""

    ts_ns: int
    step: int
    dropped_comms: int = 0
    """Communicators the writer could not track (its pool was full); version 2."""
    dropped_ops: int = 0
    """Ops the writer could not track; their flows are missing too; version 2."""
    dropped_flows: int = 0
    """Flows (proxy ops) the writer could not track; version 2."""
    pxn_flows: int = 0
    """Flows run here for another process (PXN), not in this ring; version 2."""
    unseen_ops: int = 0
    """Collectives NCCL's API announced that reached the writer with no op
    event (NCCL ran them without telling the plugin); version 4."""
    abandoned_ops: int = 0
    """Ops released without OP_DONE: their communicator was finalized (destroyed
    or aborted) mid-op, or their flows stopped moving after the kernel ended;
    version 4."""
    orphan_flows: int = 0
    """Flows NCCL started and never stepped or stopped (CollNet, CUDA-memcpy
    P2P), released once their op's kernel ended; version 4."""


@dataclass(frozen=True)
class CommRanks:
    """Up to six members of a communicator: global ranks ``first..first+5`` in it.

    A communicator of ``nranks`` members takes ``ceil(nranks / 6)`` records;
    unused entries of the last one are ``-1`` (layout version 2).
    """

    ts_ns: int
    comm: int
    nranks: int
    first: int
    r0: int = -1
    r1: int = -1
    r2: int = -1
    r3: int = -1
    r4: int = -1
    r5: int = -1

    @property
    def ranks(self) -> tuple[int, ...]:
        """The global ranks this record carries, in communicator order."""
        got = (self.r0, self.r1, self.r2, self.r3, self.r4, self.r5)
        return tuple(r for r in got if r >= 0)


@dataclass(frozen=True)
class CommName:
    """The communicator's name or role, e.g. ``world``, ``dp`` (layout version 2)."""

    ts_ns: int
    comm: int
    name: bytes

    @property
    def text(self) -> str:
        """The name as text (zero padding removed, bad UTF-8 replaced)."""
        return self.name.rstrip(b"\0").decode("utf-8", "replace")


@dataclass(frozen=True)
class FlowSteps:
    """Proxy-step counters of a flow beside its FLOW_PROGRESS (layout version 3).

    Written by the NCCL profiler plugin with every FLOW_PROGRESS of the flow,
    at the same ``ts_ns``. On a send flow ``posted`` counts SendGPUWait (slots
    the proxy offered the GPU) and bytes 52 carry ``ready_wait_us`` (layout
    version 4, 0 before): the microseconds the flow's steps spent with their
    data ready in the FIFO before ``isend`` took them (SendPeerWait to
    SendWait), summed, the head step's current wait included; NCCL checks only
    the head step for readiness, so a send's G is at most T + 1 and this time
    is its "ready but not sent" measure. On a recv flow ``posted`` counts
    RecvWait (equal to the recv G) and ``received`` RecvFlushWait (data
    arrived from the network). ``nbytes`` sums NCCL's ``transSize`` at
    SendWait (send) or RecvFlushWait (recv).
    """

    ts_ns: int
    comm: int
    seq: int
    channel: int
    direction: int
    peer: int
    posted: int
    received: int
    nbytes: int

    @property
    def ready_wait_us(self) -> int:
        """A send flow's ready-but-not-sent time in µs (0 on a recv flow)."""
        return self.received if self.direction == 0 else 0


def comm_ranks_records(
    ts_ns: int, comm: int, ranks: tuple[int, ...]
) -> list[CommRanks]:
    """Split a communicator's member list into COMM_RANKS records."""
    out: list[CommRanks] = []
    step = COMM_RANKS_PER_SLOT
    for first in range(0, len(ranks), step):
        chunk = list(ranks[first : first + step])
        chunk += [-1] * (step - len(chunk))
        out.append(CommRanks(ts_ns, comm, len(ranks), first, *chunk))
    return out


def comm_name_record(ts_ns: int, comm: int, name: str) -> CommName:
    """A COMM_NAME record; the name is cut to 32 bytes of UTF-8."""
    raw = name.encode("utf-8")[:COMM_NAME_BYTES]
    return CommName(ts_ns, comm, raw)


RingRecord = (
    Comm
    | OpIssued
    | FlowProgress
    | FlowDone
    | OpDone
    | Beat
    | CommRanks
    | CommName
    | FlowSteps
)

_KIND_OF: dict[type, Kind] = {
    Comm: Kind.COMM,
    OpIssued: Kind.OP_ISSUED,
    FlowProgress: Kind.FLOW_PROGRESS,
    FlowDone: Kind.FLOW_DONE,
    OpDone: Kind.OP_DONE,
    Beat: Kind.BEAT,
    CommRanks: Kind.COMM_RANKS,
    CommName: Kind.COMM_NAME,
    FlowSteps: Kind.FLOW_STEPS,
}
_TYPE_OF: dict[Kind, type] = {v: k for k, v in _KIND_OF.items()}


_ZERO4 = b"\0\0\0\0"


def checksum(slot: bytes | bytearray) -> int:
    """CRC-32 of the 64 slot bytes with bytes 12..15 (the checksum) as zero."""
    crc = zlib.crc32(slot[0:12])
    crc = zlib.crc32(_ZERO4, crc)
    return zlib.crc32(slot[16:SLOT_SIZE], crc)


def payload_fields(record: RingRecord) -> tuple[int | bytes, ...]:
    """The payload struct fields of ``record`` (everything but ``ts_ns``)."""
    values = tuple(record.__dict__.values())
    return values[1:]


def encode_slot(index: int, record: RingRecord) -> bytes:
    """Return the 64 committed bytes of record number ``index``."""
    kind = _KIND_OF[type(record)]
    seq_word = 2 * index + 2
    body = bytearray(SLOT_SIZE)
    SLOT_HEAD.pack_into(body, 0, seq_word, kind, 0, 0, 0, record.ts_ns)
    PAYLOADS[kind].pack_into(body, SLOT_HEAD.size, *payload_fields(record))
    struct.pack_into("<I", body, 12, zlib.crc32(body))
    return bytes(body)


def decode_slot(slot: bytes) -> tuple[int, RingRecord | None]:
    """Return ``(sequence word, record)``; record is None when the slot is invalid.

    Invalid means: checksum mismatch, unknown kind, or an odd sequence word.
    """
    seq_word, kind, _flags, _res, crc, ts_ns = SLOT_HEAD.unpack_from(slot)
    if seq_word & 1 or checksum(slot) != crc:
        return seq_word, None
    try:
        k = Kind(kind)
    except ValueError:
        return seq_word, None
    fields = PAYLOADS[k].unpack_from(slot, SLOT_HEAD.size)
    record: RingRecord = _TYPE_OF[k](ts_ns, *fields)
    return seq_word, record
