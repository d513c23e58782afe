"""Flight Recorder import on dumps of real 4-rank gloo jobs made on the fly.

Every scenario of ``bench/torch_job.py`` runs untraced with a watchdog that
dumps the FR (pickle and JSON) after 3 s without progress, on an error and at
the end; ``mycroft.streams.flight_recorder`` must name the culprit from the
pickle and the JSON dumps alike.

The straggler is judged against its job's own healthy iterations: on a
machine so loaded that one of them took as long as a hang threshold, the
run showed no healthy baseline to compare with, so it is made once more
(``_disturbed``); a run with a clean baseline gets no second try.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mycroft.streams import flight_recorder as fr
from mycroft.streams.core.config import DetectorConfig
from tests.unit.torch import harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(110)]

CASES = [
    "stall",
    "straggler",
    "crash",
    "mismatch",
    "order",
]


FAULT_AT = int(harness.COMMON[harness.COMMON.index("--fault-at") + 1])


def _intervals(d: fr.FrDumps) -> dict[int, list[int]]:
    """Per rank, ms between successive world all-reduces (one per iteration)."""
    return {
        r: [
            (b.created_ns - a.created_ns) // 1_000_000
            for a, b in zip(world, world[1:], strict=False)
        ]
        for r, rows in sorted(d.entries.items())
        for world in [[e for e in rows if e.pg == "0"]]
    }


def _disturbed(d: fr.FrDumps) -> bool:
    """A healthy iteration took a hang threshold or more."""
    limit_ms = DetectorConfig().hang_min_s * 1000
    healthy = [ms for iv in _intervals(d).values() for ms in iv[:FAULT_AT]]
    return max(healthy, default=0) >= limit_ms


@pytest.mark.parametrize("scenario", CASES)
def test_fr_names_culprit(tmp_path: Path, scenario: str) -> None:
    out = tmp_path / "fr"
    pickles = harness.generate_dumps(scenario, out)
    if scenario == "straggler" and _disturbed(fr.load_dir(pickles, world_size=4)):
        out = tmp_path / "fr-again"
        pickles = harness.generate_dumps(scenario, out)
    rank, component, kind = harness.FR_EXPECTED[scenario]
    for folder in (pickles, out / "json"):
        d = fr.load_dir(folder, world_size=4)
        doc = fr.analyze(d)
        best = doc["root_causes"][0] if doc["root_causes"] else None
        assert best is not None, (
            doc["flight_recorder"],
            [a["summary"] for a in doc["anomalies"]],
            _intervals(d),
            harness.logs(out / "logs"),
        )
        assert (best["rank"], best["kind"]) == (rank, kind), doc["root_causes"][:3]
        if scenario == "crash":
            component = "process"
        assert best["component"] == component, doc["root_causes"][:3]
        assert len({r["rank"] for r in doc["root_causes"] if r["best"]}) == 1
