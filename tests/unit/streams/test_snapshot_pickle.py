"""Snapshots: a restored engine takes on the worker's current config, and a
snapshot of another release still restores the job's topology."""

from __future__ import annotations

import io
import logging
import pickle
from typing import Any

import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import Topology
from mycroft.streams import faust_runtime
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.rca_config import RcaConfig
from mycroft.streams.faust_runtime import JobRouter, JobSlot, dump_slot, load_slot
from mycroft.streams.snapshot_pickle import dumps, loads


def _configs(obj: Any) -> list[Any]:
    """Every DetectorConfig and RcaConfig reachable from ``obj``."""
    found: list[Any] = []

    class Finder(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:
            if type(o) in (DetectorConfig, RcaConfig):
                found.append(o)
            return None

    Finder(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return found


def _engine(cfg: DetectorConfig) -> Analyzer:
    out = ListWriter()
    simulate(SimConfig(tp=2, pp=2, dp=2, duration_s=4.0, seed=5), [], out)
    engine = Analyzer("j", cfg)
    for ts, rec in out.records:
        engine.ingest(rec, ts)
    engine.evaluate(out.records[-1][0])
    return engine


OLD = DetectorConfig(hang_min_s=2.0)
NOW = DetectorConfig(hang_min_s=3.0, rca=RcaConfig(max_confidence=0.7))


def test_every_reference_takes_the_current_config() -> None:
    back, kept = loads(dumps(_engine(OLD)), NOW)
    assert kept == set()
    found = _configs(back)
    assert len(found) >= 3  # the engine, its context, its tracker, ...
    assert all(c is NOW or c is NOW.rca for c in found)


def test_other_baseline_sizes_keep_the_snapshots_thresholds() -> None:
    now = DetectorConfig(baseline_window=32, hang_min_s=3.0, rca=NOW.rca)
    back, kept = loads(dumps(_engine(OLD)), now)
    assert kept == {"baseline_window", "hang_min_s"}
    assert back.cfg.baseline_window == 64 and back.cfg.hang_min_s == 2.0
    assert back.cfg.rca is now.rca
    assert all(c is back.cfg or c is now.rca for c in _configs(back))


def test_without_a_config_the_snapshot_keeps_its_own() -> None:
    back, kept = loads(dumps(_engine(OLD)), None)
    assert kept == set() and back.cfg == OLD


def test_the_router_restores_and_says_what_was_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    blob = dump_slot(JobSlot("j", 0, _engine(OLD), 0, 0.0))
    slot, kept = load_slot(blob, 0, 1.0, NOW)
    assert not kept and isinstance(slot.engine, Analyzer)
    assert slot.engine.cfg is NOW
    router = JobRouter(Analyzer, DetectorConfig(slow_of=7))
    with caplog.at_level(logging.WARNING):
        assert router.restore([("j", blob)], 0, 1.0) == 1
    engine = router.slots["j"].engine
    assert isinstance(engine, Analyzer) and engine.cfg.slow_of == 5
    assert "slow_of" in caplog.text and "hang_min_s" in caplog.text


def test_a_snapshot_of_another_release_restarts_the_job_from_its_topology(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A job's topology is on a compacted topic, read once, long before the
    # committed offsets a restarted worker resumes from: without the
    # records the snapshot held, the job would only see undeclared ranks.
    out = ListWriter()
    simulate(SimConfig(tp=4, pp=2, dp=2, duration_s=3.0, seed=5), [], out)
    topology = [r for _, r in out.records if isinstance(r, Topology)]
    later = [r for _, r in out.records[len(out.records) // 2 :]]
    slot = JobSlot("j", 0, Analyzer("j"))
    for t in topology:
        slot.ingest(t, 0.0)
    blob = dump_slot(slot)
    written = faust_runtime.SNAPSHOT_VERSION
    monkeypatch.setattr(faust_runtime, "SNAPSHOT_VERSION", 99)
    router = JobRouter(Analyzer)
    with caplog.at_level(logging.WARNING):
        assert router.restore([("j", blob)], 0, 1.0) == 1
    assert f"version {written} is not 99" in caplog.text
    fresh = router.slots["j"]
    assert fresh.topology.keys() == {t.host for t in topology}
    for r in later:
        fresh.ingest(r, 1.0)
    fresh.advance(lambda _: "end", 2.0)
    engine = fresh.engine
    assert isinstance(engine, Analyzer)
    assert len(topology) == 2  # noqa: PLR2004 - two hosts
    gate = engine.gate
    assert gate.topo.world == 16  # noqa: PLR2004 - every rank declared
    assert gate.held == [] and gate.take() == []  # none waits for a topology
