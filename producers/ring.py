"""The shared-memory trace ring: a never-blocking writer and a counting reader.

One ring per training process, a pre-allocated file (normally under
``/dev/shm``) laid out as ``schemas/ring.md`` describes. The writer overwrites
the oldest slot when the ring is full; the reader notices by sequence numbers
and counts what it missed (``overwritten``) and what it could not trust
(``corrupt``). Neither side takes a lock.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from pathlib import Path

from mycroft.producers.ring_layout import (
    HEADER_SIZE,
    JOB_ID_BYTES,
    JOB_ID_OFFSET,
    PAYLOADS,
    SLOT_HEAD,
    SLOT_SIZE,
    U64,
    VERSION,
    VERSION_MAX,
    WRITE_IDX_OFFSET,
    FlowSteps,
    Kind,
    RingHeader,
    RingRecord,
    decode_slot,
    encode_slot,
)

DEFAULT_NSLOTS = 1 << 16
"""64 Ki slots = 4 MiB per process; the paper's 512 MB/host is 1 Mi slots per GPU."""

_FLOW = PAYLOADS[Kind.FLOW_PROGRESS]
_ISSUED = PAYLOADS[Kind.OP_ISSUED]
_DONE = PAYLOADS[Kind.OP_DONE]
_CRC = struct.Struct("<I")


def ring_bytes(nslots: int) -> int:
    """Size in bytes of a ring file with ``nslots`` slots."""
    return HEADER_SIZE + nslots * SLOT_SIZE


class RingWriter:
    """The training-process side: append records, never block, never fail on full.

    Args:
        path: the ring file; created (atomically, via rename) and pre-allocated.
        rank: global rank of this process.
        nslots: slot count (a power of two is recommended for C writers).
        local_rank: rank on this host, or -1.
        version: layout version stamped in the header; 2 is needed before
            writing COMM_RANKS / COMM_NAME records (readers of version 1 reject
            such rings instead of counting their slots as corrupt).
        job_id: the training job's id for the header (version 4).
    """

    def __init__(
        self,
        path: Path | str,
        rank: int,
        nslots: int = DEFAULT_NSLOTS,
        local_rank: int = -1,
        *,
        version: int = VERSION,
        job_id: str = "",
    ) -> None:
        if nslots < 2:
            raise ValueError(f"nslots must be >= 2, got {nslots}")
        self.path = Path(path)
        self.nslots = nslots
        self.index = 0
        if not 1 <= version <= VERSION_MAX:
            raise ValueError(f"ring layout version must be 1..{VERSION_MAX}")
        if job_id and version < 4:
            raise ValueError("a job id in the header needs ring layout version 4")
        header = RingHeader(
            nslots, os.getpid(), rank, time.time_ns(), local_rank, version, job_id
        )
        tmp = self.path.with_name(self.path.name + ".init")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, ring_bytes(nslots))
            self._mm = mmap.mmap(fd, ring_bytes(nslots))
        finally:
            os.close(fd)
        self._mm[0 : len(header.pack())] = header.pack()
        self._mm[WRITE_IDX_OFFSET : WRITE_IDX_OFFSET + 8] = U64.pack(0)
        self._mm[JOB_ID_OFFSET : JOB_ID_OFFSET + JOB_ID_BYTES] = header.pack_job_id()
        os.replace(tmp, self.path)
        self._buf = bytearray(SLOT_SIZE)

    def write(self, record: RingRecord) -> None:
        """Append one record (overwrites the oldest slot when the ring is full)."""
        self._commit(encode_slot(self.index, record))

    def flow_progress(  # noqa: PLR0917 - mirrors the C tracepoint arguments
        self,
        ts_ns: int,
        comm: int,
        seq: int,
        channel: int,
        direction: int,
        peer: int,
        total: int,
        gpu_ready: int,
        transmitted: int,
        done: int,
    ) -> None:
        """Fast path for the most frequent record (no dataclass allocation)."""
        buf = self._buf
        SLOT_HEAD.pack_into(
            buf, 0, 2 * self.index + 2, Kind.FLOW_PROGRESS, 0, 0, 0, ts_ns
        )
        _FLOW.pack_into(
            buf,
            24,
            comm,
            seq,
            channel,
            direction,
            peer,
            total,
            gpu_ready,
            transmitted,
            done,
        )
        _CRC.pack_into(buf, 12, zlib.crc32(buf))
        self._commit(buf)

    def op_issued(  # noqa: PLR0917 - mirrors the C tracepoint arguments
        self, ts_ns: int, comm: int, seq: int, nbytes: int, kind: int, dtype: int = 0
    ) -> None:
        """Fast path of OP_ISSUED without algorithm, protocol or flows."""
        buf = self._buf
        SLOT_HEAD.pack_into(buf, 0, 2 * self.index + 2, Kind.OP_ISSUED, 0, 0, 0, ts_ns)
        _ISSUED.pack_into(buf, 24, comm, seq, nbytes, kind, 0, 0, 0, dtype, 0)
        _CRC.pack_into(buf, 12, zlib.crc32(buf))
        self._commit(buf)

    def op_done(self, ts_ns: int, comm: int, seq: int, start_ns: int) -> None:
        """Fast path of OP_DONE for an op without flow records."""
        buf = self._buf
        SLOT_HEAD.pack_into(buf, 0, 2 * self.index + 2, Kind.OP_DONE, 0, 0, 0, ts_ns)
        _DONE.pack_into(buf, 24, comm, seq, start_ns, 0)
        _CRC.pack_into(buf, 12, zlib.crc32(buf))
        self._commit(buf)

    def _commit(self, slot: bytes | bytearray) -> None:
        n = self.index
        off = HEADER_SIZE + (n % self.nslots) * SLOT_SIZE
        mm = self._mm
        mm[off : off + 8] = U64.pack(2 * n + 1)  # odd: being written
        mm[off + 8 : off + SLOT_SIZE] = slot[8:]
        mm[off : off + 8] = slot[0:8]  # even 2n+2: committed
        self.index = n + 1
        mm[WRITE_IDX_OFFSET : WRITE_IDX_OFFSET + 8] = U64.pack(n + 1)

    def close(self, unlink: bool = False) -> None:
        """Unmap the ring; the file stays for the agent to drain unless ``unlink``."""
        self._mm.close()
        if unlink:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RingReader:
    """The agent side: drain one ring read-only, counting overwrites and corrupt slots.

    Args:
        path: the ring file.
        flow_steps: also return FLOW_STEPS records (layout version 3, the NCCL
            plugin's proxy-step counters); otherwise they are skipped as valid
            records the caller does not consume, never counted corrupt.

    Raises:
        ValueError: (from the constructor) the file is not a version 1..3 ring.
    """

    def __init__(self, path: Path | str, *, flow_steps: bool = False) -> None:
        self.path = Path(path)
        self.flow_steps = flow_steps
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < HEADER_SIZE:
                raise ValueError(f"{self.path}: {size} bytes is too short for a ring")
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self.header = RingHeader.unpack(self._mm[0:HEADER_SIZE])
            if size < ring_bytes(self.header.nslots):
                raise ValueError(f"{self.path}: truncated ring ({size} bytes)")
        except ValueError:
            self._mm.close()
            raise
        self.next_index = 0
        self.records_read = 0
        self.overwritten = 0
        self.corrupt = 0
        self.last_write_ns = 0

    @property
    def identity(self) -> str:
        """Stable id of this ring incarnation (a re-created file gets a new one)."""
        return f"{self.path.name}:{self.header.pid}:{self.header.created_ns}"

    def write_index(self) -> int:
        """How many records the writer has committed so far."""
        (w,) = U64.unpack_from(self._mm, WRITE_IDX_OFFSET)
        return int(w)

    def oldest_index(self) -> int:
        """The oldest record still in the ring."""
        return max(0, self.write_index() - self.header.nslots)

    def seek(self, index: int) -> None:
        """Continue reading at record ``index`` (clamped to what the ring holds)."""
        self.next_index = min(max(index, 0), self.write_index())

    def lag(self) -> int:
        """Records committed but not read yet."""
        return self.write_index() - self.next_index

    def poll(self, max_records: int = 1 << 20) -> list[RingRecord]:
        """Return the records committed since the last call, oldest first."""
        w = self.write_index()
        nslots = self.header.nslots
        if w - self.next_index > nslots:
            self.overwritten += w - nslots - self.next_index
            self.next_index = w - nslots
        end = min(w, self.next_index + max_records)
        out: list[RingRecord] = []
        mm = self._mm
        for n in range(self.next_index, end):
            off = HEADER_SIZE + (n % nslots) * SLOT_SIZE
            slot = mm[off : off + SLOT_SIZE]
            seq_word, record = decode_slot(slot)
            expected = 2 * n + 2
            (now_word,) = U64.unpack_from(mm, off)
            if now_word != seq_word or seq_word > expected:
                self.overwritten += 1  # the writer lapped us before or while copying
            elif record is None or seq_word != expected:
                self.corrupt += 1
            else:
                self.last_write_ns = max(self.last_write_ns, record.ts_ns)
                if self.flow_steps or not isinstance(record, FlowSteps):
                    out.append(record)
        self.records_read += len(out)
        self.next_index = end
        return out

    def close(self) -> None:
        """Unmap the ring."""
        self._mm.close()
