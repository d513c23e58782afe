"""Flight Recorder import on dumps of real 4-rank gloo jobs made on the fly.

Every scenario of ``bench/torch_job.py`` runs untraced with a watchdog that
dumps the FR (pickle and JSON) after 3 s without progress, on an error and at
the end; ``mycroft.streams.flight_recorder`` must name the culprit from the
pickle and the JSON dumps alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mycroft.streams import flight_recorder as fr
from tests.unit.torch import harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(110)]

CASES = [
    "stall",
    "straggler",
    "crash",
    "mismatch",
    "order",
]


@pytest.mark.parametrize("scenario", CASES)
def test_fr_names_culprit(tmp_path: Path, scenario: str) -> None:
    pickles = harness.generate_dumps(scenario, tmp_path / "fr")
    rank, component, kind = harness.EXPECTED[scenario]
    for folder in (pickles, tmp_path / "fr" / "json"):
        doc = fr.analyze(fr.load_dir(folder, world_size=4))
        best = doc["root_causes"][0] if doc["root_causes"] else None
        assert best is not None, (doc["flight_recorder"], harness.logs(tmp_path))
        assert (best["rank"], best["kind"]) == (rank, kind), doc["root_causes"][:3]
        if scenario == "crash":
            component = "process"
        assert best["component"] == component, doc["root_causes"][:3]
        assert len({r["rank"] for r in doc["root_causes"] if r["best"]}) == 1
