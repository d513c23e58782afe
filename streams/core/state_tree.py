"""A state holder's objects as snapshot part values, without pickle.

:func:`encode_tree` turns one holder (and what it holds) into the values of
a :class:`~mycroft.streams.core.snapshot_codec.Part`: a JSON ``tree`` of
tagged nodes, and one entry per array or bytes blob it references. What it
reads is data only: builtin containers, numpy arrays and scalars, enums,
the project's Avro records (as their wire bytes), and objects of the
project's own classes (``mycroft.*``) by their attributes, or by their
``snapshot_state()`` when they define one (restored by ``restore_state``).
Decoding builds only those: nothing is imported or called outside
``mycroft.*`` classes, and no code runs but ``__new__``, a frozen record's
constructor and ``restore_state``.

An object the holder shares with another holder (its config, the job's
topology) is written as a reference by name (``refs``) and resolved to the
restoring engine's object. Within one part, an object or array met twice is
written once and restored as one object.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mycroft.schemas.codec import Codec
from mycroft.schemas.records import (
    Anomaly,
    CommSummary,
    CompletionBatch,
    Heartbeat,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.streams.core.snapshot_codec import PartError, Value

_RECORDS = (
    StateBatch,
    CompletionBatch,
    Heartbeat,
    Topology,
    Anomaly,
    RootCause,
    CommSummary,
)
_SEQS: dict[type, str] = {list: "l", tuple: "t", set: "s", frozenset: "f"}
_MAKE: dict[str, Callable[[list[Any]], Any]] = {
    "l": list,
    "t": tuple,
    "s": set,
    "f": frozenset,
}
_MAPS: dict[type, str] = {dict: "d", Counter: "C", OrderedDict: "O"}
_MAKE_MAP: dict[str, Callable[[Any], Any]] = {
    "d": dict,
    "C": lambda pairs: Counter(dict(pairs)),
    "O": OrderedDict,
}
_CODEC: list[Codec] = []


def _codec() -> Codec:
    if not _CODEC:
        _CODEC.append(Codec())  # parses the schemas: once, on first use
    return _CODEC[0]


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def class_of(path: str) -> type:
    """The ``mycroft`` class a snapshot names as ``module:qualname``."""
    module, _, name = path.partition(":")
    if not module.startswith("mycroft."):
        raise PartError(
            f"snapshot names class {path}: only mycroft classes are restored"
        )
    obj: Any = importlib.import_module(module)
    for attr in name.split("."):
        obj = getattr(obj, attr, None)
    if not isinstance(obj, type):
        raise PartError(f"snapshot names class {path}, which this release lacks")
    return obj


class _Encoder:
    def __init__(self, refs: Mapping[int, str]) -> None:
        self.refs = refs
        self.blobs: dict[str, Value] = {}
        self.arrays: dict[int, int] = {}  # id -> blob number
        self.memo: dict[int, int] = {}  # id -> object number
        self.keep: list[object] = []  # alive while encoding: ids stay unique

    def node(self, x: Any) -> Any:  # noqa: PLR0911 - one case per kind
        if isinstance(x, enum.Enum):  # before str and int: StrEnum, IntEnum
            return {"e": _path(type(x)), "v": self.node(x.value)}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if id(x) in self.refs:
            return {"ref": self.refs[id(x)]}
        if isinstance(x, (np.ndarray, np.generic, bytes)):
            return self._blob(x)
        if id(x) in self.memo:
            return {"m": self.memo[id(x)]}
        if type(x) in _SEQS:
            return {_SEQS[type(x)]: [self.node(v) for v in x]}
        if isinstance(x, deque):
            return {"q": [self.node(v) for v in x], "n": x.maxlen}
        if type(x) in _MAPS:
            pairs = [[self.node(k), self.node(v)] for k, v in x.items()]
            return {_MAPS[type(x)]: pairs}
        if isinstance(x, _RECORDS):
            return {"r": self._blob(_codec().encode(x))["b"]}
        return self._object(x)

    def _blob(self, x: np.ndarray | np.generic | bytes) -> dict[str, Any]:
        key = self.arrays.get(id(x))
        if key is None:
            key = self.arrays[id(x)] = len(self.blobs)
            self.keep.append(x)
            value = np.asarray(x) if isinstance(x, np.generic) else x
            if isinstance(value, np.ndarray) and value.dtype.hasobject:
                raise PartError(f"an array of Python objects in a {type(x).__name__}")
            self.blobs[f"b{key}"] = value
        tag = "g" if isinstance(x, np.generic) else "b"
        return {tag: f"b{key}"}

    def _object(self, x: Any) -> dict[str, Any]:
        cls = type(x)
        if not cls.__module__.startswith("mycroft."):
            raise PartError(f"cannot snapshot a {_path(cls)}: not a mycroft class")
        self.memo[id(x)] = len(self.memo)
        self.keep.append(x)
        out: dict[str, Any] = {"o": _path(cls), "i": self.memo[id(x)]}
        if hasattr(x, "snapshot_state"):
            out["s"] = self.node(x.snapshot_state())
        elif isinstance(x, tuple) and hasattr(cls, "_fields"):  # a NamedTuple
            out["k"] = {k: self.node(v) for k, v in zip(cls._fields, x, strict=True)}
        elif dataclasses.is_dataclass(x) and cls.__dataclass_params__.frozen:
            out["k"] = {
                f.name: self.node(getattr(x, f.name)) for f in dataclasses.fields(x)
            }
        else:
            names = getattr(x, "__dict__", None) or {
                s: None for s in getattr(cls, "__slots__", ()) if hasattr(x, s)
            }
            out["v"] = {k: self.node(getattr(x, k)) for k in names}
        return out


class _Decoder:
    def __init__(self, fields: Mapping[str, Value], refs: Mapping[str, object]) -> None:
        self.fields, self.refs = fields, refs
        self.memo: dict[int, object] = {}

    def node(self, n: Any) -> Any:  # noqa: PLR0911 - one case per kind
        if not isinstance(n, dict):
            return n
        (tag, value), *_ = n.items()
        if tag == "ref":
            return self.refs[value]
        if tag in {"b", "g"}:
            blob: Any = self.fields[value]
            return blob[()] if tag == "g" else blob
        if tag == "m":
            return self.memo[value]
        if tag in _MAKE:
            return _MAKE[tag]([self.node(v) for v in value])
        if tag == "q":
            return deque((self.node(v) for v in value), n["n"])
        if tag in _MAKE_MAP:
            return _MAKE_MAP[tag]((self.node(k), self.node(v)) for k, v in value)
        if tag == "e":
            return class_of(value)(self.node(n["v"]))
        if tag == "r":
            return _codec().decode(self.fields[value])  # type: ignore[arg-type]
        return self._object(n)

    def _object(self, n: dict[str, Any]) -> object:
        cls: Any = class_of(n["o"])
        if "k" in n:
            obj = cls(**{k: self.node(v) for k, v in n["k"].items()})
            self.memo[n["i"]] = obj
            return obj
        obj = cls.__new__(cls)
        self.memo[n["i"]] = obj
        if "s" in n:
            obj.restore_state(self.node(n["s"]))
        else:
            for k, v in n["v"].items():
                object.__setattr__(obj, k, self.node(v))
        return obj


def encode_tree(root: object, refs: Mapping[int, str]) -> dict[str, Value]:
    """The part values of ``root``; objects whose id is in ``refs`` by name.

    Raises:
        PartError: ``root`` holds something that is not data (a function, a
            file, an object of another package): give its class a
            ``snapshot_state()`` that leaves it out.
    """
    enc = _Encoder({k: v for k, v in refs.items() if k != id(root)})
    tree = json.dumps(enc.node(root))
    return {"tree": tree, **enc.blobs}


def decode_tree(fields: Mapping[str, Value], refs: Mapping[str, object]) -> Any:
    """Rebuild what :func:`encode_tree` wrote, references resolved by ``refs``.

    Raises:
        PartError: the values do not decode (with what went wrong).
    """
    try:
        return _Decoder(fields, refs).node(json.loads(str(fields["tree"])))
    except PartError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure loses this part only
        raise PartError(f"{type(exc).__name__}: {exc}") from exc


def layout(fields: Mapping[str, Value]) -> list[str]:
    """The classes a part's tree holds, each with the attribute names it was
    written with (``module:qualname(a,b,...)``), sorted: what a part's
    version stands for."""
    found: set[str] = set()
    stack: list[Any] = [json.loads(str(fields["tree"]))]
    while stack:
        n = stack.pop()
        if isinstance(n, list):
            stack.extend(n)
        elif isinstance(n, dict):
            if "o" in n:
                names = n["v"] if "v" in n else n.get("k") or {"<state>": 0}
                found.add(f"{n['o']}({','.join(names)})")
            stack.extend(n.values())
    return sorted(found)
