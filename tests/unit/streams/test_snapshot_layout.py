"""Each snapshot part's version stands for one layout of what it holds.

A part's holder keeps objects by their attributes: adding, renaming or
retyping an attribute of any class in a part changes what the part's
version means. This test pins each part's layout (the classes it holds and
their attribute names, on a slowdown job with an open incident) to its
version, so such a change fails here until the part's version is bumped.
The config part is not pinned: it is rebuilt by its constructor, so a new
config key takes its default and a removed one rebuilds the part.
"""

from __future__ import annotations

import hashlib

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.snapshot_parts import CONFIG, snapshot_engine
from mycroft.streams.core.state_tree import layout

LAYOUTS = {
    "progress": (1, "132cf5cc63f2"),
    "transfers": (1, "d038c529a3b6"),
    "topology": (1, "cce4299b16d4"),
    "baselines": (1, "9f75edccde7c"),
    "gate": (1, "32d6824b13ca"),
    "dedup": (1, "30710d5da001"),
    "recent": (1, "c82da7f59528"),
    "incidents": (1, "bf830898e36a"),
    "pending": (1, "e3b0c44298fc"),
    "rhythm": (1, "5741a73190dd"),
}
"""Part -> (version, digest of its layout)."""


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


def test_each_part_version_stands_for_one_layout() -> None:
    out = ListWriter()
    fault = parse_spec("nic-bandwidth:rank=9,at=2.0,severity=0.7")
    simulate(SimConfig(tp=2, pp=2, dp=4, duration_s=4.0, seed=5), [fault], out)
    engine = Analyzer("j")
    for ts, rec in out.records:
        engine.ingest(rec, ts)
    engine.evaluate(out.records[-1][0])
    assert engine.incident is not None, "the layout is taken with an open incident"
    parts = [p for p in snapshot_engine(engine) if p.name != CONFIG.name]
    assert {p.name for p in parts} == set(LAYOUTS)
    for part in parts:
        got = (part.version, _digest(layout(part.fields)))
        assert got == LAYOUTS[part.name], (
            f"part {part.name!r} now holds {layout(part.fields)}: if a class or "
            f"attribute changed, bump its version in snapshot_parts.PARTS and "
            f"set LAYOUTS[{part.name!r}] = ({part.version + 1}, {got[1]!r})"
        )
