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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mycroft.producers.torch.frops import UNKNOWN_KIND, op_kind, op_name

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
    out_sizes: str = ""
    dtypes: str = ""
    state: str = ""
    started_ns: int = 0
    p2p: bool = False
    peer: int = -1
    p2p_seq: int = -1
    rows: int = 1
    """Flight Recorder rows this entry stands for (a coalesced group's rows
    share one ``collective_seq_id`` and are one op here)."""

    @property
    def known(self) -> bool:
        """Whether the op name has a Mycroft op kind."""
        return self.kind != UNKNOWN_KIND


@dataclass
class FrDumps:
    """What a directory of dumps says, and what could not be read."""

    entries: dict[int, list[FrEntry]] = field(default_factory=dict)
    mtime_ns: dict[int, int] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    world: int = 0
    unknown_ops: dict[str, int] = field(default_factory=dict)
    """Rows per op name outside ``frops.TORCH_OPS`` (kept, never dropped)."""
    p2p: dict[int, list[FrEntry]] = field(default_factory=dict)
    """Per rank, its send/recv entries (not sequenced per group)."""

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


def nbytes(sizes: list[Any], dtypes: list[Any]) -> int:
    """Bytes of tensors of ``sizes`` (element size from ``dtypes``; Float
    where a dtype is missing, 1 byte where it is unknown)."""
    dtypes = [*dtypes, *["Float"] * len(sizes)]
    return sum(
        math.prod(int(d) for d in shape) * _DTYPE_BYTES.get(str(t), 1)
        for shape, t in zip(sizes, dtypes, strict=False)
    )


def _peer(profiling_name: object, name: str) -> int:
    """Group-local peer of a send (``send 0->1``) or recv (``recv 1<-0``)."""
    if name not in ("send", "recv"):
        return -1
    found = re.search(r"(\d+)(->|<-)(\d+)", str(profiling_name or ""))
    return -1 if found is None else int(found.group(3))


def _detail(e: dict[str, Any]) -> tuple[str, str]:
    """Output sizes and ``input | output`` dtypes, as compared across ranks."""
    dtypes = [*(e.get("input_dtypes") or []), "|", *(e.get("output_dtypes") or [])]
    return str(list(e.get("output_sizes") or [])), " ".join(str(t) for t in dtypes)


def _entry(rank: int, e: dict[str, Any]) -> FrEntry:
    """One Flight Recorder entry dict as an ``FrEntry`` of ``rank``."""
    pg = e.get("process_group") or ("", "")
    name = op_name(e.get("profiling_name"))
    sizes = list(e.get("input_sizes") or [])
    out_sizes, dtypes = _detail(e)
    return FrEntry(
        rank,
        str(pg[0]),
        str(pg[1]) if len(pg) > 1 else "",
        int(e.get("collective_seq_id", 0)) - 1,
        name,
        op_kind(name),
        int(nbytes(sizes, list(e.get("input_dtypes") or []))),
        str(sizes),
        int(e.get("time_created_ns") or 0),
        bool(e.get("retired", False)),
        int(e.get("time_discovered_completed_ns") or 0),
        out_sizes,
        dtypes,
        str(e.get("state") or ""),
        int(e.get("time_discovered_started_ns") or 0),
        bool(e.get("is_p2p")),
        _peer(e.get("profiling_name"), name),
        int(e.get("p2p_seq_id") or 0) if e.get("is_p2p") else -1,
    )


_STATES = ("scheduled", "started", "completed")


def _unit(rows: list[FrEntry]) -> FrEntry:
    """Coalesced rows sharing one sequence id, as one op: sizes side by side,
    bytes summed, retired and state as far as its least advanced row."""
    if len(rows) == 1:
        return rows[0]
    named = [e for e in rows if e.op != "coalesced"] or rows
    least = min((e.state for e in rows), key=lambda s: (_STATES + (s,)).index(s))
    return replace(
        named[0],
        op="+".join(dict.fromkeys(e.op for e in named)),
        nbytes=sum(e.nbytes for e in rows),
        sizes=" ".join(e.sizes for e in rows),
        out_sizes=" ".join(e.out_sizes for e in rows),
        dtypes=" ".join(e.dtypes for e in rows),
        created_ns=min(e.created_ns for e in rows),
        retired=all(e.retired for e in rows),
        completed_ns=max(e.completed_ns for e in rows),
        started_ns=max(e.started_ns for e in rows),
        state=least,
        rows=len(rows),
    )


def _units(rows: list[FrEntry]) -> list[FrEntry]:
    """Group-collective entries merged per ``(pg, seq)``, in issue order."""
    by_op: dict[tuple[str, int], list[FrEntry]] = {}
    for e in rows:
        by_op.setdefault((e.pg, e.seq), []).append(e)
    return sorted((_unit(g) for g in by_op.values()), key=lambda e: e.created_ns)


def _keep(out: FrDumps, rank: int, rows: list[FrEntry]) -> None:
    """File one rank's entries: p2p apart, unknown names counted."""
    for e in rows:
        if not e.known:
            out.unknown_ops[e.op] = out.unknown_ops.get(e.op, 0) + 1
    out.p2p[rank] = [e for e in rows if e.p2p]
    out.entries[rank] = _units([e for e in rows if not e.p2p])


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
        _keep(out, rank, rows)
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
