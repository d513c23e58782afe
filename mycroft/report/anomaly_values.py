"""The baselines an incident's anomalies fired on, read from the anomalies.

An anomaly record carries its measured value and the baseline (or limit) it
was held against in its summary, written by the detectors
(``streams/core/detect.py``, ``detect_slow.py``). Anomalies of one detector
on one comm are one :class:`Fired`: the ops they name, the worst value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from mycroft.schemas.records import Anomaly
from mycroft.schemas.vocab import OP_NAMES

_SLOW = re.compile(
    r"^(?P<op>\w+) seq (?P<seq>\d+) on comm (?:0x)?[0-9a-f]+:(?: rank (?P<rank>\d+))? "
    r"(?P<metric>\w+) (?P<value>-?[\d.]+) ms vs baseline (?P<base>-?[\d.]+) ms"
)
_HANG = re.compile(
    r"no progress for (?P<value>[\d.]+) s \(limit (?P<base>[\d.]+) s\) "
    r"at seq (?P<seq>\d+)"
)
_LAG = re.compile(
    r"^seq (?P<seq>\d+) on comm (?:0x)?[0-9a-f]+: rank (?P<rank>\d+)'s .* keep "
    r"(?P<value>[\d.]+) chunks .*\(role baseline (?P<base>-?[\d.]+)\)"
)


@dataclass(frozen=True)
class Fired:
    """What one detector fired on one comm: worst value against its baseline.

    ``value`` and ``baseline`` are seconds, or chunks when ``unit`` says so;
    ``metric`` is the baseline's name (``xfer``, ``span``, ``late``,
    ``stall``, ``td``).
    """

    detector: str
    comm: int
    metric: str
    unit: str
    value: float
    baseline: float
    score: float
    seqs: tuple[int, ...]
    count: int
    op_kind: int | None = None
    rank: int | None = None

    @property
    def label(self) -> str:
        """``xfer of allreduce on comm 3af1..``: what the panel shows."""
        op = f" of {OP_NAMES[self.op_kind]}" if self.op_kind is not None else ""
        who = f" rank {self.rank}" if self.rank is not None else ""
        return f"{self.metric}{op}{who} on comm 0x{self.comm:016x}"


def _parse(a: Anomaly) -> Fired | None:
    comm = a.comms[0] if a.comms else 0
    if (m := _SLOW.match(a.summary)) is not None:
        op = m["op"]
        return Fired(
            a.detector, comm, m["metric"], "s",
            float(m["value"]) / 1e3, float(m["base"]) / 1e3, a.score,
            (int(m["seq"]),), 1,
            OP_NAMES.index(op) if op in OP_NAMES else None,
            int(m["rank"]) if m["rank"] else None,
        )  # fmt: skip
    if (m := _HANG.search(a.summary)) is not None:
        return Fired(
            a.detector, comm, "stall", "s", float(m["value"]), float(m["base"]),
            a.score, (int(m["seq"]),), 1,
        )  # fmt: skip
    if (m := _LAG.match(a.summary)) is not None:
        return Fired(
            a.detector, comm, "td", "chunks", float(m["value"]), float(m["base"]),
            a.score, (int(m["seq"]),), 1, None, int(m["rank"]),
        )  # fmt: skip
    return None


def fired_of(anomalies: Sequence[Anomaly]) -> list[Fired]:
    """One :class:`Fired` per (detector, comm, rank), highest score first.

    Anomalies without a baseline in their summary (a rank that stopped
    reporting, a mismatch) are left out: the page lists them as text.
    """
    by: dict[tuple[str, int, int | None], Fired] = {}
    for a in anomalies:
        f = _parse(a)
        if f is None:
            continue
        key = (f.detector, f.comm, f.rank)
        old = by.get(key)
        if old is None:
            by[key] = f
            continue
        worst = f if f.score > old.score else old
        by[key] = Fired(
            worst.detector, worst.comm, worst.metric, worst.unit, worst.value,
            worst.baseline, worst.score, tuple(sorted({*old.seqs, *f.seqs})),
            old.count + 1, worst.op_kind, worst.rank,
        )  # fmt: skip
    return sorted(by.values(), key=lambda f: (-f.score, f.detector, f.comm))
