"""Recorded traces: the records a node agent would publish, in a replayable file.

A trace file holds exactly the Kafka values Mycroft publishes (single-object
Avro, see ``mycroft.schemas.codec``) with enough framing to replay them to
Kafka or analyze them offline. Layout::

    b"MYCTRACE1\\n"
    frame*:  <u32 frame length, excluding these 4 bytes>
             <i64 trace time, ns>  <u8 record type code>  <u16 key length>
             <key, UTF-8>  <value: wire bytes>

Record type codes index :data:`RECORD_TYPES`. Trace files are named
``*.trace`` (every command and doc uses that one extension; the reader does
not check it); a path ending in ``.gz`` (``run.trace.gz``) is
gzip-compressed. A truncated last frame (a writer killed mid-write) is
reported by :func:`read_frames` and ignored, never raised.
"""

from __future__ import annotations

import gzip
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from mycroft.errors import InputError
from mycroft.kafka_client import record_key
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import Record

log = logging.getLogger(__name__)

MAGIC = b"MYCTRACE1\n"
RECORD_TYPES: tuple[str, ...] = (
    "StateBatch",
    "CompletionBatch",
    "Heartbeat",
    "Topology",
    "Anomaly",
    "RootCause",
)
_FRAME = struct.Struct("<qBH")


class RecordWriter(Protocol):
    """Where a trace source puts its records: a file, Kafka, or a list in tests."""

    def write(self, record: Record, ts_ns: int) -> None:
        """Accept one record observed at trace time ``ts_ns``."""

    def close(self) -> None:
        """Flush and release resources."""


@dataclass(frozen=True)
class Frame:
    """One framed record of a trace file."""

    ts_ns: int
    record_type: str
    key: str
    value: bytes


def _open(path: Path, mode: str) -> BinaryIO:
    if path.suffix == ".gz":
        return cast(BinaryIO, gzip.GzipFile(path, mode + "b", compresslevel=1))
    return cast(BinaryIO, open(path, mode + "b"))  # noqa: SIM115 - the owner closes it


class TraceFileWriter:
    """Append encoded records to a trace file."""

    def __init__(self, path: Path | str, codec: Codec | None = None) -> None:
        self.path = Path(path)
        self.codec = codec or Codec()
        self.frames = 0
        self._fh = _open(self.path, "w")
        self._fh.write(MAGIC)

    def write(self, record: Record, ts_ns: int) -> None:
        """Encode and append one record."""
        _, key = record_key(record)
        self.write_frame(
            Frame(ts_ns, type(record).__name__, key, self.codec.encode(record))
        )

    def write_frame(self, frame: Frame) -> None:
        """Append one already-encoded frame."""
        key = frame.key.encode("utf-8")
        head = _FRAME.pack(frame.ts_ns, RECORD_TYPES.index(frame.record_type), len(key))
        body = head + key + frame.value
        self._fh.write(struct.pack("<I", len(body)) + body)
        self.frames += 1

    def close(self) -> None:
        """Flush and close the file."""
        self._fh.close()

    def __enter__(self) -> TraceFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_frames(path: Path | str) -> Iterator[Frame]:
    """Yield the frames of a trace file in order.

    A trace cut short (its recorder died with the job) is read up to its
    last whole frame, with a warning naming the cut: plain or gzip alike.

    Raises:
        InputError: the file is not a Mycroft trace (a ConfigError), or it
            was cut before its first whole frame.
    """
    path = Path(path)
    read = 0
    with _open(path, "r") as fh:
        try:
            if fh.read(len(MAGIC)) != MAGIC:
                raise InputError(f"{path} is not a Mycroft trace file (bad magic)")
            for frame in _frames(fh, path):
                read += 1
                yield frame
        except EOFError as exc:  # a gzip stream without its end
            if not read:
                raise InputError(
                    f"{path} is cut short before its first record ({exc})"
                ) from exc
            log.warning("%s: compressed stream cut short, the rest ignored", path)


def _frames(fh: BinaryIO, path: Path) -> Iterator[Frame]:
    """The frames after the magic, up to the end or the first cut frame."""
    while True:
        size_bytes = fh.read(4)
        if not size_bytes:
            return
        if len(size_bytes) < 4:
            log.warning("%s: truncated frame header at the end, ignored", path)
            return
        (size,) = struct.unpack("<I", size_bytes)
        body = fh.read(size)
        if len(body) < size or size < _FRAME.size:
            log.warning(
                "%s: truncated last frame (%d of %d bytes), ignored",
                path,
                len(body),
                size,
            )
            return
        ts_ns, code, key_len = _FRAME.unpack_from(body)
        key_end = _FRAME.size + key_len
        yield Frame(
            ts_ns,
            RECORD_TYPES[code],
            body[_FRAME.size : key_end].decode("utf-8"),
            body[key_end:],
        )


def read_records(
    path: Path | str, codec: Codec | None = None
) -> Iterator[tuple[int, Record]]:
    """Yield ``(trace time ns, decoded record)`` of a trace file in order."""
    codec = codec or Codec()
    for frame in read_frames(path):
        yield frame.ts_ns, codec.decode(frame.value)


class ListWriter:
    """Keep records in memory (tests, in-process pipelines)."""

    def __init__(self) -> None:
        self.records: list[tuple[int, Record]] = []

    def write(self, record: Record, ts_ns: int) -> None:
        """Keep one record."""
        self.records.append((ts_ns, record))

    def close(self) -> None:
        """Nothing to release."""
