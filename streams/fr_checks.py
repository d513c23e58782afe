"""Cross-rank checks of Flight Recorder ops: names, sizes, dtypes, state.

Each op (a group's sequence number; coalesced rows are one op) is compared
across the ranks that recorded it. The value most ranks share is the
reference; a rank with another op name, input sizes, output sizes (an
out-of-place op writes a tensor of its own) or dtypes is listed. Sizes that
legitimately differ per rank (``frops.OUT_OF_PLACE_EXEMPT``) are not
compared. ``state`` (scheduled, started, completed) is reported, not judged:
in a hang, who started the op and who did not is the evidence.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mycroft.producers.torch.frdump import FrDumps, FrEntry
from mycroft.producers.torch.frops import OUT_OF_PLACE_EXEMPT

_FIELDS: tuple[tuple[str, str], ...] = (("op", "op"), ("input_sizes", "sizes"))
_FIELDS += (("output_sizes", "out_sizes"), ("dtypes", "dtypes"))


def ops_by_unit(d: FrDumps) -> dict[tuple[str, int], list[FrEntry]]:
    """Every rank's entry of each ``(group, seq)``."""
    out: dict[tuple[str, int], list[FrEntry]] = {}
    for rows in d.entries.values():
        for e in rows:
            out.setdefault((e.pg, e.seq), []).append(e)
    return out


def _exempt(field: str, op: str) -> bool:
    side = field.split("_", maxsplit=1)[0]
    names = set(op.split("+"))
    return bool(names & OUT_OF_PLACE_EXEMPT.get(side, frozenset()))


def _odd(rows: list[FrEntry], field: str, attr: str) -> dict[str, Any] | None:
    """Ranks whose ``attr`` differs from the value most ranks share."""
    values = {e.rank: str(getattr(e, attr)) for e in rows}
    if field != "op" and _exempt(field, rows[0].op):
        return None
    common, n = Counter(values.values()).most_common(1)[0]
    if n == len(values):
        return None
    odd = sorted(r for r, v in values.items() if v != common)
    return {
        "field": field,
        "expected": common,
        "found": {str(r): values[r] for r in odd},
        "ranks": odd,
        "minority": len(odd) < n,
    }


def mismatches(d: FrDumps) -> list[dict[str, Any]]:
    """Per op recorded by two ranks or more, the fields some ranks disagree on."""
    out = []
    for (pg, seq), rows in sorted(ops_by_unit(d).items()):
        if len(rows) < 2:
            continue
        for field, attr in _FIELDS:
            got = _odd(rows, field, attr)
            if got is not None:
                at_s = min(e.created_ns for e in rows) / 1e9
                where = {"group": pg, "collective_seq_id": seq + 1, "issued_s": at_s}
                out.append(where | got)
    return out


def states(rows: list[FrEntry]) -> dict[str, list[int]]:
    """Ranks per ``state`` of one op (empty when every rank agrees)."""
    out: dict[str, list[int]] = {}
    for e in rows:
        out.setdefault(e.state or "unknown", []).append(e.rank)
    return {k: sorted(v) for k, v in sorted(out.items())} if len(out) > 1 else {}


def unknown_line(d: FrDumps) -> str:
    """``"2 records with unknown op names: foo (2)"``; empty when none."""
    if not d.unknown_ops:
        return ""
    n = sum(d.unknown_ops.values())
    names = ", ".join(f"{k} ({v})" for k, v in sorted(d.unknown_ops.items()))
    return f"{n} records with unknown op names: {names}"
