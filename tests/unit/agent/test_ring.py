"""Ring buffer layout, wraparound, overwrite and corrupt-slot accounting."""

from __future__ import annotations

import mmap
import struct
import zlib
from pathlib import Path

import pytest

from mycroft.producers import ring_layout as L
from mycroft.producers.ring import RingReader, RingWriter, ring_bytes


def _flow(i: int) -> L.FlowProgress:
    return L.FlowProgress(1000 + i, 0xABCD, i, 2, 0, 5, 8, 4, 3, 2)


def test_layout_constants_match_the_document() -> None:
    assert L.SLOT_SIZE == 64 and L.HEADER_SIZE == 128 and L.WRITE_IDX_OFFSET == 64
    assert L.HEADER.size == 44 and L.SLOT_HEAD.size == 24
    assert all(s.size == 40 for s in L.PAYLOADS.values())
    assert ring_bytes(16) == 128 + 16 * 64


def test_every_kind_round_trips(tmp_path: Path) -> None:
    records: list[L.RingRecord] = [
        L.Comm(1, 0xFFFF_FFFF_FFFF_FFFF, 8, 3, 4, 1),
        L.OpIssued(2, 7, 0, 1 << 33, 2, 1, 3, 4),
        L.FlowProgress(3, 7, 0, 1, 1, 6, 10, 9, 8, 7),
        L.FlowDone(4, 7, 0, 3, 1, 1, 6, 10),
        L.OpDone(5, 7, 0, 3, 4),
        L.Beat(6, 42),
    ]
    with RingWriter(tmp_path / "r.ring", rank=3, nslots=8, local_rank=1) as w:
        for r in records:
            w.write(r)
        reader = RingReader(tmp_path / "r.ring")
        assert reader.header.rank == 3 and reader.header.local_rank == 1
        assert reader.poll() == records
        assert reader.poll() == []
        reader.close()


def test_fast_path_equals_generic_encoding(tmp_path: Path) -> None:
    with (
        RingWriter(tmp_path / "a.ring", 0, 4) as a,
        RingWriter(tmp_path / "b.ring", 0, 4) as b,
    ):
        a.write(_flow(0))
        r = _flow(0)
        b.flow_progress(
            r.ts_ns,
            r.comm,
            r.seq,
            r.channel,
            r.direction,
            r.peer,
            r.total,
            r.gpu_ready,
            r.transmitted,
            r.done,
        )
    assert (tmp_path / "a.ring").read_bytes()[128:] == (
        tmp_path / "b.ring"
    ).read_bytes()[128:]


def test_wraparound_without_loss_when_the_reader_keeps_up(tmp_path: Path) -> None:
    with RingWriter(tmp_path / "r.ring", 0, nslots=8) as w:
        reader = RingReader(tmp_path / "r.ring")
        got = []
        for i in range(100):
            w.write(_flow(i))
            if i % 5 == 4:
                got += reader.poll()
        got += reader.poll()
        reader.close()
    assert [r.seq for r in got] == list(range(100))  # type: ignore[union-attr]
    assert reader.overwritten == 0 and reader.corrupt == 0


def test_overwrites_are_counted_exactly_and_the_writer_never_blocks(
    tmp_path: Path,
) -> None:
    with RingWriter(tmp_path / "r.ring", 0, nslots=8) as w:
        reader = RingReader(tmp_path / "r.ring")
        for i in range(50):  # no reader: the writer just overwrites
            w.write(_flow(i))
        got = reader.poll()
        reader.close()
    assert [r.seq for r in got] == list(range(42, 50))  # type: ignore[union-attr]
    assert reader.overwritten == 42
    assert reader.records_read + reader.overwritten == 50


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mm:
        mm[offset : offset + len(data)] = data


def test_corrupt_slot_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "r.ring"
    with RingWriter(path, 0, nslots=8) as w:
        for i in range(5):
            w.write(_flow(i))
        _patch(path, 128 + 2 * 64 + 50, b"\xff")  # payload bit rot in record 2
        _patch(path, 128 + 3 * 64, struct.pack("<Q", 2 * 3 + 1))  # torn: odd sequence
        reader = RingReader(path)
        got = reader.poll()
        reader.close()
    assert [r.seq for r in got] == [0, 1, 4]  # type: ignore[union-attr]
    assert reader.corrupt == 2 and reader.overwritten == 0


def test_checksum_is_crc32_of_the_slot_with_a_zero_crc_field(tmp_path: Path) -> None:
    slot = bytearray(L.encode_slot(5, _flow(5)))
    crc = struct.unpack_from("<I", slot, 12)[0]
    slot[12:16] = b"\0\0\0\0"
    assert crc == zlib.crc32(slot)
    assert struct.unpack_from("<Q", slot)[0] == 12


def test_not_a_ring_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.ring").write_bytes(b"\0" * 256)
    with pytest.raises(ValueError, match="not a Mycroft ring"):
        RingReader(tmp_path / "x.ring")


def test_worked_example_of_the_document() -> None:
    """The hex dump in schemas/ring.md is exactly what the writer produces."""
    text = (Path(__file__).parents[3] / "schemas" / "ring.md").read_text()
    block = text.split("<!-- example-slot -->")[1].split("```")[1]
    dumped = bytes.fromhex(
        "".join(
            line.split("|")[0].split(":", 1)[1] for line in block.strip().splitlines()
        )
    )
    want = L.encode_slot(
        5,
        L.FlowProgress(
            1_700_000_000_000_000_000, 0x1122334455667788, 3, 1, 0, 9, 16, 12, 10, 8
        ),
    )
    assert dumped == want
