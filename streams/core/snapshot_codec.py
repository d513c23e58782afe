"""Snapshot parts as bytes, without pickle.

A part is a name, a part version and a flat dict of values: numpy arrays
(any dtype but ``object``), ints, floats, bools, None, strings and bytes.
A snapshot is a sequence of parts, each framed on its own so that a reader
can skip one it does not know (or that fails to decode) and keep the rest.

Layout (little endian)::

    snapshot = MAGIC, u32 count, count x (u16 len, name, u32 version, u64 len, body)
    body     = u32 len, JSON header, blobs

The JSON header holds the scalars and strings by value, and the name, kind
(``arr`` or ``bytes``) and length of each blob; an array is its raw C-order
bytes, its dtype (numpy's ``.npy`` header description of it, which never
holds a pickle) and shape in the header. A part holds thousands of small
structured arrays of a few dtypes (one per collective kept): each dtype is
parsed once per part, where one ``.npy`` file per array parsed its header
each time, most of a restore's time. Why this framing rather than
``np.savez``: scalars keep their Python type, a part is readable by any
release (JSON, raw bytes and numpy's dtype descriptions are stable), and
there is no zip directory to build per part.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"MYCROFT-SNAP1\n"
"""First bytes of a snapshot in this format (a pickle starts with 0x80)."""

Value = np.ndarray | int | float | bool | str | bytes | None
_SCALARS = (int, float, bool, str, type(None))


class PartError(ValueError):
    """A snapshot or one of its parts that cannot be read; the part is rebuilt."""


@dataclass(frozen=True)
class Part:
    """One state holder's snapshot: its name, its part version, its values."""

    name: str
    version: int
    fields: dict[str, Value] = field(default_factory=dict)


@dataclass(frozen=True)
class Sealed:
    """A part read from a snapshot, its body not decoded yet."""

    name: str
    version: int
    body: bytes

    def open(self) -> Part:
        """Decode the body (raises :class:`PartError`)."""
        return Part(self.name, self.version, decode_fields(self.body))


def encode_fields(values: dict[str, Value]) -> bytes:
    """Encode a flat dict of values (raises :class:`PartError` on objects)."""
    scalars: dict[str, object] = {}
    blobs: list[tuple[str, str, bytes]] = []
    shapes: dict[str, list[object]] = {}
    for key, value in values.items():
        if isinstance(value, np.ndarray):
            shapes[key] = [_descr(key, value.dtype), list(value.shape)]
            blobs.append((key, "arr", np.ascontiguousarray(value).tobytes()))
        elif isinstance(value, bytes):
            blobs.append((key, "bytes", value))
        elif isinstance(value, _SCALARS):
            scalars[key] = value
        else:
            raise PartError(
                f"snapshot value {key!r} is a {type(value).__name__}: convert it to "
                "an array, a scalar, a string or bytes before snapshotting"
            )
    meta = [[k, kind, len(b)] for k, kind, b in blobs]
    header = json.dumps({"scalars": scalars, "blobs": meta, "arrays": shapes}).encode()
    return b"".join([struct.pack("<I", len(header)), header, *(b for *_, b in blobs)])


def _descr(key: str, dtype: np.dtype) -> object:
    """``dtype`` as JSON; raises :class:`PartError` on Python objects."""
    if dtype.hasobject:
        raise PartError(
            f"snapshot array {key!r} holds Python objects: store its values as "
            "a numeric or fixed-width string array, or as encoded bytes"
        )
    return np.lib.format.dtype_to_descr(dtype)


def decode_fields(body: bytes) -> dict[str, Value]:
    """Decode what :func:`encode_fields` wrote (raises :class:`PartError`)."""
    try:
        (n,) = struct.unpack_from("<I", body)
        header = json.loads(body[4 : 4 + n])
        out: dict[str, Value] = dict(header["scalars"])
        shapes = header["arrays"]
        dtypes: dict[str, np.dtype] = {}
        at = 4 + n
        for key, kind, size in header["blobs"]:
            blob = body[at : at + size]
            if len(blob) != size:
                raise PartError(f"snapshot value {key!r} is truncated")
            out[key] = blob if kind == "bytes" else _array(blob, shapes[key], dtypes)
            at += size
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise PartError(f"snapshot part does not decode: {exc}") from exc
    return out


def _array(blob: bytes, shape: list[object], dtypes: dict[str, np.dtype]) -> np.ndarray:
    """One ``arr`` blob back as its array; ``dtypes`` caches the part's
    dtypes by their JSON description."""
    descr, dims = shape
    text = json.dumps(descr)
    dtype = dtypes.get(text)
    if dtype is None:
        dtype = dtypes[text] = np.lib.format.descr_to_dtype(_tuples(descr))  # type: ignore[arg-type]  # built from JSON
    if dtype.hasobject or not isinstance(dims, list):
        raise PartError(f"snapshot array of dtype {dtype} cannot be read")
    # frombuffer is read-only and shares the snapshot's bytes: the state
    # holders write into their arrays, so each gets its own copy.
    return np.frombuffer(blob, dtype=dtype).reshape(dims).copy()


def _tuples(descr: object) -> object:
    """A structured dtype's description with JSON's lists made tuples again."""
    if isinstance(descr, list):
        return [tuple(_field(f)) for f in descr]
    return descr


def _field(f: list[object]) -> list[object]:
    """``[name, dtype]``, or ``[name, dtype, shape]`` of a subarray field."""
    name, dtype, *shape = f
    return [name, _tuples(dtype), *(tuple(s) for s in shape if isinstance(s, list))]


def encode_snapshot(parts: list[Part]) -> bytes:
    """Frame ``parts`` into one snapshot."""
    out = [MAGIC, struct.pack("<I", len(parts))]
    for part in parts:
        name, body = part.name.encode(), encode_fields(part.fields)
        out += [struct.pack("<H", len(name)), name]
        out += [struct.pack("<IQ", part.version, len(body)), body]
    return b"".join(out)


def is_snapshot(data: bytes) -> bool:
    """Whether ``data`` is a snapshot in this format (an older one is not)."""
    return data.startswith(MAGIC)


def decode_snapshot(data: bytes) -> list[Sealed]:
    """Split a snapshot into its parts, bodies still encoded.

    Raises:
        PartError: not a snapshot in this format, or its framing is cut short
            (each part's body is decoded on its own by :meth:`Sealed.open`).
    """
    if not is_snapshot(data):
        raise PartError("not a part-encoded snapshot (an older release wrote it?)")
    try:
        (count,) = struct.unpack_from("<I", data, len(MAGIC))
        at, parts = len(MAGIC) + 4, []
        for _ in range(count):
            (n,) = struct.unpack_from("<H", data, at)
            name = data[at + 2 : at + 2 + n].decode()
            version, size = struct.unpack_from("<IQ", data, at + 2 + n)
            at += 2 + n + 12
            parts.append(Sealed(name, version, data[at : at + size]))
            at += size
    except (struct.error, UnicodeDecodeError) as exc:
        raise PartError(f"snapshot framing is cut short: {exc}") from exc
    return parts
