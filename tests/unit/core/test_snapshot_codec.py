"""Snapshot parts round trip without pickle; objects are refused."""

from __future__ import annotations

import pickletools

import numpy as np
import pytest

from mycroft.streams.core.snapshot_codec import (
    Part,
    PartError,
    decode_snapshot,
    encode_snapshot,
    is_snapshot,
)


def _part() -> Part:
    rows = np.zeros(3, dtype=[("rank", "i4"), ("t", "f8")])
    rows["rank"] = [1, 2, 3]
    return Part(
        "progress",
        2,
        {
            "rows": rows,
            "names": np.array(["a", "bb"]),
            "n": 7,
            "x": 0.5,
            "nan": float("nan"),
            "ok": True,
            "none": None,
            "job": "j",
            "blob": b"\x80\x05raw",
        },
    )


def test_a_part_round_trips_with_its_types() -> None:
    (back,) = [s.open() for s in decode_snapshot(encode_snapshot([_part()]))]
    want = _part()
    assert (back.name, back.version) == ("progress", 2)
    assert set(back.fields) == set(want.fields)
    for key in ("n", "x", "ok", "none", "job", "blob"):
        assert back.fields[key] == want.fields[key]
        assert type(back.fields[key]) is type(want.fields[key])
    assert np.isnan(back.fields["nan"])  # type: ignore[arg-type]
    assert np.array_equal(back.fields["rows"], want.fields["rows"])  # type: ignore[arg-type]
    assert back.fields["rows"].dtype == want.fields["rows"].dtype  # type: ignore[union-attr]


def test_plain_arrays_keep_shape_order_and_are_writable() -> None:
    arrays = {
        "grid": np.arange(12, dtype=">i8").reshape(3, 4).T,  # not C-ordered
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(2.5),
        "names": np.array(["a", "bcd"]),
        "when": np.array([1, 2], dtype="datetime64[ns]"),
        "nested": np.ones(2, dtype=[("a", "u1"), ("b", [("c", "<f4", (2,))])]),
        "aligned": np.ones(3, dtype=np.dtype([("x", "u1"), ("y", "<i8")], align=True)),
    }
    (back,) = [
        s.open() for s in decode_snapshot(encode_snapshot([Part("p", 1, arrays)]))
    ]
    for key, want in arrays.items():
        got = back.fields[key]
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert np.array_equal(got, want), key
        assert got.flags.writeable, key  # holders write into restored arrays


def test_object_arrays_and_objects_are_refused() -> None:
    with pytest.raises(PartError, match="holds Python objects"):
        encode_snapshot([Part("p", 1, {"a": np.array([{}], dtype=object)})])
    with pytest.raises(PartError, match="convert it"):
        encode_snapshot([Part("p", 1, {"a": [1, 2]})])  # type: ignore[dict-item]


def test_a_snapshot_is_not_a_pickle_and_a_pickle_is_not_a_snapshot() -> None:
    data = encode_snapshot([_part()])
    assert is_snapshot(data) and not data.startswith(b"\x80")
    with pytest.raises(Exception):  # noqa: B017, PT011 - any pickle error
        list(pickletools.genops(data))
    with pytest.raises(PartError, match="older release"):
        decode_snapshot(b"\x80\x05" + data)


def test_a_broken_part_fails_alone() -> None:
    data = encode_snapshot([_part(), Part("clock", 1, {"n": 1})])
    sealed = decode_snapshot(data)
    broken = type(sealed[0])("progress", 2, sealed[0].body[:40])
    with pytest.raises(PartError):
        broken.open()
    assert sealed[1].open().fields == {"n": 1}
