"""State trees: data round trips with its types and sharing; nothing else
is written or built."""

from __future__ import annotations

import json
from collections import Counter, OrderedDict, deque
from fractions import Fraction

import numpy as np
import pytest

from mycroft.schemas.vocab import FaultKind
from mycroft.streams.core.snapshot_codec import PartError
from mycroft.streams.core.state_tree import decode_tree, encode_tree, layout
from mycroft.streams.core.topology import JobTopology


def test_containers_scalars_and_enums_keep_their_types() -> None:
    arr = np.arange(4, dtype=np.int32)
    value = {
        "d": {(1, "a"): [1.5, None, True]},
        "c": Counter({"x": 3}),
        "o": OrderedDict([(2, "b"), (1, "a")]),
        "q": deque([1, 2], maxlen=5),
        "s": {frozenset({1, 2})},
        "g": np.float32(0.25),
        "e": FaultKind.HANG,
        "b": b"\x00raw",
        "a": arr,
        "again": arr,  # one array, written once
    }
    back = decode_tree(encode_tree(value, {}), {})
    assert back["d"] == value["d"] and back["c"] == value["c"]
    assert type(back["c"]) is Counter and type(back["o"]) is OrderedDict
    assert list(back["o"]) == [2, 1]
    assert back["q"] == value["q"] and back["q"].maxlen == 5  # noqa: PLR2004
    assert back["s"] == value["s"] and back["e"] is FaultKind.HANG
    assert type(back["g"]) is np.float32 and back["g"] == np.float32(0.25)
    assert back["b"] == b"\x00raw" and back["a"].dtype == np.int32
    assert back["a"] is back["again"]


def test_shared_objects_stay_shared_and_references_resolve() -> None:
    topo, other = JobTopology(job_id="j"), JobTopology(job_id="k")
    fields = encode_tree([topo, topo, other], {id(other): "other"})
    theirs = JobTopology(job_id="theirs")
    a, b, c = decode_tree(fields, {"other": theirs})
    assert a is b and a == topo and c is theirs
    assert layout(fields) == ["mycroft.streams.core.topology:JobTopology(<state>)"]


def test_objects_of_other_packages_are_neither_written_nor_built() -> None:
    with pytest.raises(PartError, match="not a mycroft class"):
        encode_tree({"x": Fraction(1, 3)}, {})
    with pytest.raises(PartError, match="holds Python objects|Python objects"):
        encode_tree(np.array([{}], dtype=object), {})
    tree = json.dumps({"o": "fractions:Fraction", "i": 0, "v": {}})
    with pytest.raises(PartError, match="only mycroft classes"):
        decode_tree({"tree": tree}, {})
