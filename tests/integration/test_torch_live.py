"""Real torch.distributed jobs (gloo, 4 ranks) traced live through the pipeline.

Each scenario runs 4 real ranks of ``bench/torch_job.py`` traced through the
``MYCROFT_TORCH_TRACE=1`` hook, a real ``mycroft agent`` draining their rings
into the real broker, and one real ``mycroft streams worker`` for the module;
the root-cause topic must name the injected culprit (rank and fault kind; the
component where the evidence fixes it). Timing-based scenarios (straggler,
order deadlock) are in ``test_torch_live_timing.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mycroft.streams.faust_settings import StreamSettings
from tests.unit.torch import harness, live

pytestmark = [pytest.mark.integration, pytest.mark.timeout(110)]


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamSettings]:
    yield from live.worker(kafka_bootstrap, tmp_path_factory.mktemp("torch-live"))


@pytest.mark.parametrize("scenario", ["stall", "crash", "mismatch"])
def test_live_culprit(worker: StreamSettings, tmp_path: Path, scenario: str) -> None:
    rank, component, kind = harness.EXPECTED[scenario]
    found = live.run_live(worker, scenario, tmp_path)
    hits = [r for r in found if live.named(r, rank, kind)]
    assert hits, (
        f"wanted rank {rank} {kind}; root causes {live.summary(found)}\n"
        f"{harness.logs(tmp_path / 'logs')}"
    )
    if scenario != "crash":  # see harness.EXPECTED for the crash component
        assert hits[0].culprits[0].component.value == component, live.summary(found)
