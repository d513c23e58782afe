"""A bounded, append-only, on-disk write-ahead spool of encoded Kafka records.

Every record the agent makes is appended here *before* it is produced, and
stays until Kafka acknowledges it (acks=all). So a broker outage, a failed
delivery or an agent restart never loses a record the agent has made; what is
unacknowledged is replayed in order. Files in ``directory``::

    <16-digit segment id>.seg   entries: <u32 body length> <u32 CRC-32 of body> body
                                body: <u8 type> <u16 topic len> <u16 key len>
                                      <u16 job len> topic key job value
    cursor.json                 {"segment": S, "offset": O}: everything before
                                is acknowledged (written by rename, not fsynced)

Entry type 0 is a record, type 1 a checkpoint (``value`` is JSON of the source
cursors; never sent). fsync: the active segment every ``fsync_s`` seconds and
at roll and close. Bound: when the segments exceed ``max_bytes`` the oldest
segment is deleted and its unacknowledged records are counted in ``dropped``.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_FRAME = struct.Struct("<II")
_BODY = struct.Struct("<BHHH")
RECORD, CHECKPOINT = 0, 1


@dataclass(frozen=True)
class Entry:
    """One encoded Kafka record: where it goes and its bytes."""

    topic: str
    key: str
    job_id: str
    value: bytes


@dataclass(frozen=True)
class _Loc:
    segment: int
    offset: int
    size: int


def _encode(kind: int, entry: Entry) -> bytes:
    t, k, j = entry.topic.encode(), entry.key.encode(), entry.job_id.encode()
    body = _BODY.pack(kind, len(t), len(k), len(j)) + t + k + j + entry.value
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _decode(body: bytes) -> tuple[int, Entry]:
    kind, lt, lk, lj = _BODY.unpack_from(body)
    p = _BODY.size
    t, k, j = (
        body[p : p + lt],
        body[p + lt : p + lt + lk],
        body[p + lt + lk : p + lt + lk + lj],
    )
    return kind, Entry(t.decode(), k.decode(), j.decode(), body[p + lt + lk + lj :])


class Spool:
    """The write-ahead spool. Record ids (``eid``) grow by one per appended record.

    Args:
        directory: where segments live (created).
        max_bytes: bound on all segments together.
        segment_bytes: a segment is rolled once it is this large.
        fsync_s: fsync the active segment at most this often; 0 = every append.
    """

    def __init__(
        self,
        directory: Path | str,
        max_bytes: int = 256 << 20,
        segment_bytes: int = 8 << 20,
        fsync_s: float = 1.0,
    ) -> None:
        if max_bytes < 2 * segment_bytes:
            raise ValueError("spool max_bytes must hold at least two segments")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.segment_bytes, self.fsync_s = (
            max_bytes,
            segment_bytes,
            fsync_s,
        )
        self.dropped = 0
        self.corrupt = 0
        self.checkpoint: dict[str, Any] = {}
        self._pending: OrderedDict[int, _Loc] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._next_eid = 0
        self._last_fsync = time.monotonic()
        self._recover()
        self._active = max(self._sizes, default=0) + 1
        self._sizes[self._active] = 0
        self._fh = open(self._path(self._active), "ab")  # noqa: SIM115 - owned

    def _path(self, segment: int) -> Path:
        return self.dir / f"{segment:016d}.seg"

    def _recover(self) -> None:
        cur_seg, cur_off = 0, 0
        try:
            cur = json.loads((self.dir / "cursor.json").read_text())
            cur_seg, cur_off = int(cur["segment"]), int(cur["offset"])
        except (OSError, ValueError, KeyError):
            pass
        for path in sorted(self.dir.glob("*.seg")):
            seg = int(path.stem)
            self._sizes[seg] = path.stat().st_size
            for off, size, kind, entry in self._scan(seg):
                if kind == CHECKPOINT:
                    self.checkpoint = json.loads(entry.value)
                elif (seg, off) >= (cur_seg, cur_off):
                    self._pending[self._next_eid] = _Loc(seg, off, size)
                    self._next_eid += 1
        if self._pending:
            log.info("spool %s: %d records to replay", self.dir, len(self._pending))

    def _scan(self, seg: int) -> Iterator[tuple[int, int, int, Entry]]:
        data = self._path(seg).read_bytes()
        off = 0
        while off + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, off)
            body = data[off + _FRAME.size : off + _FRAME.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                self.corrupt += 1
                log.warning(
                    "spool segment %d: torn or corrupt entry at %d, rest ignored",
                    seg,
                    off,
                )
                return
            kind, entry = _decode(body)
            yield off, _FRAME.size + length, kind, entry
            off += _FRAME.size + length

    @property
    def pending(self) -> int:
        """Records appended and not acknowledged (nor dropped)."""
        return len(self._pending)

    @property
    def size_bytes(self) -> int:
        """Bytes in all segments."""
        return sum(self._sizes.values())

    @property
    def next_eid(self) -> int:
        """The id the next appended record will get."""
        return self._next_eid

    def append(
        self, entries: Sequence[Entry], checkpoint: dict[str, Any] | None = None
    ) -> int:
        """Append records (and a checkpoint) in one write; return the first new eid."""
        first = self._next_eid
        if self._sizes[self._active] >= self.segment_bytes:
            self._roll()
        blobs, off = [], self._sizes[self._active]
        for e in entries:
            blob = _encode(RECORD, e)
            self._pending[self._next_eid] = _Loc(self._active, off, len(blob))
            self._next_eid += 1
            blobs.append(blob)
            off += len(blob)
        if checkpoint is not None:
            self.checkpoint = checkpoint
            blobs.append(
                _encode(CHECKPOINT, Entry("", "", "", json.dumps(checkpoint).encode()))
            )
        data = b"".join(blobs)
        self._fh.write(data)
        self._fh.flush()
        self._sizes[self._active] += len(data)
        self._maybe_fsync()
        self._enforce_bound()
        return first

    def read(self, eid: int) -> Entry | None:
        """The record ``eid`` if still pending, read back from disk."""
        loc = self._pending.get(eid)
        if loc is None:
            return None
        with open(self._path(loc.segment), "rb") as fh:
            fh.seek(loc.offset)
            blob = fh.read(loc.size)
        return _decode(blob[_FRAME.size :])[1]

    def pending_from(self, eid: int, limit: int) -> list[int]:
        """Up to ``limit`` pending record ids ``>= eid``, in order."""
        return list(islice((e for e in self._pending if e >= eid), max(limit, 0)))

    def first_pending(self) -> int | None:
        """The oldest unacknowledged record id, or None."""
        return next(iter(self._pending), None)

    def ack(self, eid: int) -> None:
        """Kafka acknowledged ``eid``."""
        self._pending.pop(eid, None)

    def _maybe_fsync(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_fsync >= self.fsync_s:
            os.fsync(self._fh.fileno())
            self._last_fsync = now

    def _roll(self) -> None:
        self._maybe_fsync(force=True)
        self._fh.close()
        self._active += 1
        self._sizes[self._active] = 0
        self._fh = open(self._path(self._active), "ab")  # noqa: SIM115 - owned

    def _enforce_bound(self) -> None:
        while self.size_bytes > self.max_bytes:
            if min(self._sizes) == self._active:
                self._roll()
            oldest = min(self._sizes)
            lost = [e for e, loc in self._pending.items() if loc.segment == oldest]
            for e in lost:
                del self._pending[e]
            self.dropped += len(lost)
            log.error(
                "spool full (%d bytes): dropped segment %d with %d unsent records",
                self.max_bytes,
                oldest,
                len(lost),
            )
            self._delete(oldest)

    def _delete(self, seg: int) -> None:
        self._path(seg).unlink(missing_ok=True)
        del self._sizes[seg]

    def commit(self) -> None:
        """Persist the ack cursor and delete fully acknowledged segments."""
        first = self.first_pending()
        loc = (
            (self._active, self._sizes[self._active])
            if first is None
            else (self._pending[first].segment, self._pending[first].offset)
        )
        tmp = self.dir / "cursor.json.tmp"
        tmp.write_text(json.dumps({"segment": loc[0], "offset": loc[1]}))
        os.replace(tmp, self.dir / "cursor.json")
        for seg in [s for s in self._sizes if s < loc[0]]:
            self._delete(seg)

    def close(self) -> None:
        """fsync, persist the cursor and close."""
        self._maybe_fsync(force=True)
        self.commit()
        self._fh.close()
