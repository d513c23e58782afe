"""Reading PyTorch Flight Recorder dumps: one per rank, pickle 2.x or JSON.

Torch-free. Empty, truncated, foreign or unsupported files are reported in
``FrDumps.skipped``, never raised; pickles go through an unpickler that only
builds plain containers (a dump is data, not code). gloo's malformed
``pg_config`` (one ``''`` group with ranks ``'[]'``) is tolerated: members come
from a valid ``pg_config`` entry, the world (``world_size``, the dumps' rank
numbers) for the default group, else the ranks whose entries name the group.
Used by ``mycroft.streams.flight_recorder``.
"""

from __future__ import annotations

import ast
import io
import json
import math
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mycroft.schemas.vocab import OP_NAMES

_OPS = {
    "all_reduce": "allreduce",
    "allreduce": "allreduce",
    "all_reduce_coalesced": "allreduce",
    "all_gather": "allgather",
    "allgather": "allgather",
    "_allgather_base": "allgather",
    "all_gather_into_tensor": "allgather",
    "reduce_scatter": "reducescatter",
    "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_tensor": "reducescatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
    "all_to_all": "alltoall",
    "alltoall": "alltoall",
    "alltoall_base": "alltoall",
    "all_to_all_single": "alltoall",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
}
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4}
_DTYPE_BYTES |= {"Long": 8, "Short": 2, "Char": 1, "Byte": 1, "Bool": 1}


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, str, numbers only: a dump is data."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"dump references {module}.{name}")


@dataclass(frozen=True)
class FrEntry:
    """One collective of one rank (``seq`` from 0: ``collective_seq_id - 1``)."""

    rank: int
    pg: str
    desc: str
    seq: int
    op: str
    kind: int
    nbytes: int
    sizes: str
    created_ns: int
    retired: bool
    completed_ns: int = 0


@dataclass
class FrDumps:
    """What a directory of dumps says, and what could not be read."""

    entries: dict[int, list[FrEntry]] = field(default_factory=dict)
    mtime_ns: dict[int, int] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    world: int = 0

    @property
    def missing(self) -> list[int]:
        """Ranks of the world without a readable dump."""
        return [r for r in range(self.world) if r not in self.entries]


def _parse_ranks(text: object) -> list[int]:
    try:
        got = ast.literal_eval(text) if isinstance(text, str) else text
    except (ValueError, SyntaxError):
        return []
    if isinstance(got, list | tuple):
        return [int(r) for r in got if isinstance(r, int)]
    return []


def read_dump(path: Path) -> dict[str, Any]:
    """Decode one dump file.

    Raises:
        ValueError: empty, truncated, not a dump or an unsupported version.
    """
    data = path.read_bytes()
    if not data.strip():
        raise ValueError("empty file")
    try:
        if data.lstrip()[:1] == b"{":
            doc = json.loads(data)
        else:
            doc = _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise ValueError(f"truncated or not a Flight Recorder dump ({exc})") from None
    if not isinstance(doc, dict) or "version" not in doc:
        raise ValueError("not a Flight Recorder dump (no version)")
    if not str(doc["version"]).startswith("2."):
        raise ValueError(f"unsupported dump version {doc['version']!r} (want 2.x)")
    return doc


def _entry(rank: int, e: dict[str, Any]) -> FrEntry | None:
    if e.get("is_p2p"):
        return None
    pg = e.get("process_group") or ("", "")
    name = str(e.get("profiling_name", "")).split(":")[-1]
    op = _OPS.get(name, name)
    kind = OP_NAMES.index(op) if op in OP_NAMES else 200 + sum(op.encode()) % 50
    sizes = e.get("input_sizes") or []
    dtypes = list(e.get("input_dtypes") or []) + ["Float"] * len(sizes)
    nbytes = sum(
        math.prod(int(d) for d in s) * _DTYPE_BYTES.get(str(t), 1)
        for s, t in zip(sizes, dtypes, strict=False)
    )
    return FrEntry(
        rank,
        str(pg[0]),
        str(pg[1]) if len(pg) > 1 else "",
        int(e.get("collective_seq_id", 0)) - 1,
        name,
        kind,
        int(nbytes),
        str(sizes),
        int(e.get("time_created_ns") or 0),
        bool(e.get("retired", False)),
        int(e.get("time_discovered_completed_ns") or 0),
    )


def load_dir(path: Path | str, world_size: int = 0) -> FrDumps:
    """Read every dump of ``path``; unreadable files are listed in ``skipped``."""
    out = FrDumps()
    known: set[int] = set()
    configs: list[dict[str, Any]] = []
    for f in sorted(Path(path).iterdir()):
        found = re.search(r"(\d+)$", f.name)
        if not f.is_file() or f.name.startswith(".") or found is None:
            continue
        rank = int(found.group(1))
        known.add(rank)
        try:
            doc = read_dump(f)
            rows = [_entry(rank, e) for e in doc.get("entries") or []]
        except (ValueError, OSError, KeyError, TypeError) as exc:
            out.skipped.append({"file": f.name, "reason": str(exc)})
            continue
        out.entries[rank] = sorted(
            (e for e in rows if e is not None), key=lambda e: e.created_ns
        )
        out.mtime_ns[rank] = f.stat().st_mtime_ns
        configs.append(doc.get("pg_config") or {})
    listed = {r for c in configs for v in c.values() for r in _parse_ranks(v["ranks"])}
    out.world = max([world_size, *(r + 1 for r in known | listed)])
    _groups(out, configs)
    return out


def _groups(out: FrDumps, configs: list[dict[str, Any]]) -> None:
    users: dict[str, set[int]] = {}
    for rank, rows in out.entries.items():
        for e in rows:
            users.setdefault(e.pg, set()).add(rank)
            out.roles.setdefault(e.pg, e.desc)
    for pg, ranks in users.items():
        valid = [_parse_ranks(c[pg]["ranks"]) for c in configs if pg in c]
        if out.roles[pg] == "default_pg" or pg == "0":
            members = list(range(out.world))
        elif any(valid):
            members = max(valid, key=len)
        else:
            members = sorted(ranks)
        out.groups[pg] = tuple(members)
