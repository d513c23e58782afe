"""Live torch scenarios that need timing: a straggler and an order deadlock.

Same pipeline as ``test_torch_live.py`` (real ranks, agent, broker, worker),
split off so that each file stays under two minutes on two cores.
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
    yield from live.worker(kafka_bootstrap, tmp_path_factory.mktemp("torch-timing"))


def test_live_straggler(worker: StreamSettings, tmp_path: Path) -> None:
    rank, _component, kind = harness.EXPECTED["straggler"]
    # The slowdown is named a few ops after onset; on a loaded machine the
    # worker may lag the job by several seconds, hence the long wait.
    found = live.run_live(worker, "straggler", tmp_path, timeout_s=75)
    assert any(live.named(r, rank, kind) for r in found), (
        f"root causes {live.summary(found)}\n{harness.logs(tmp_path / 'logs')}"
    )


def test_live_order_deadlock(worker: StreamSettings, tmp_path: Path) -> None:
    rank, _component, kind = harness.EXPECTED["order"]
    # A worker lagging on a loaded machine took over 20 s to name it; the
    # wait ends as soon as it is named.
    found = live.run_live(worker, "order", tmp_path, timeout_s=60)
    assert any(live.named(r, rank, kind) for r in found), live.summary(found)
