"""CRC-64-AVRO (Rabin) fingerprints, as the Avro specification defines them."""

from __future__ import annotations

_EMPTY = 0xC15D213AA4D7A795


def _table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


_TABLE = _table()


def crc64_avro(data: bytes) -> int:
    """Return the 64-bit Rabin fingerprint of ``data`` (the schema's canonical form)."""
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp
