"""Snapshots are parts, one per state holder: a restored engine takes on the
worker's current config, a part this release cannot read is rebuilt alone,
and nothing in a snapshot is a pickle."""

from __future__ import annotations

import logging
import pickle
import zlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import RootCause, Topology
from mycroft.streams.app import default_engine_factory
from mycroft.streams.core import snapshot_parts
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.rca_config import RcaConfig
from mycroft.streams.core.snapshot_codec import (
    Sealed,
    decode_snapshot,
    encode_snapshot,
)
from mycroft.streams.faust_runtime import JobRouter, JobSlot, dump_slot, load_slot

OLD = DetectorConfig(hang_min_s=2.0)
NOW = DetectorConfig(hang_min_s=3.0, rca=RcaConfig(max_confidence=0.7))
SLOW = "nic-bandwidth:rank=9,at=2.0,severity=0.7"


def _records(fault: str | None = None, seconds: float = 4.0) -> list[tuple[int, Any]]:
    out = ListWriter()
    faults = [parse_spec(fault)] if fault else []
    simulate(SimConfig(tp=2, pp=2, dp=4, duration_s=seconds, seed=5), faults, out)
    return out.records


def _engine(
    cfg: DetectorConfig, records: list[tuple[int, Any]] | None = None
) -> Analyzer:
    records = records or _records()
    engine = Analyzer("j", cfg)
    for ts, rec in records:
        engine.ingest(rec, ts)
    engine.evaluate(records[-1][0])
    return engine


def _reframe(blob: bytes, change: dict[str, Sealed]) -> bytes:
    """``blob`` with some parts replaced (as another release wrote them)."""
    parts = [change.get(p.name, p) for p in decode_snapshot(zlib.decompress(blob))]
    out = [encode_snapshot([]), *_frames(parts)]
    count = len(parts).to_bytes(4, "little")
    head = out[0][:-4] + count
    return zlib.compress(head + b"".join(out[1:]), 1)


def _frames(parts: list[Sealed]) -> list[bytes]:
    frames = []
    for p in parts:
        name = p.name.encode()
        frames.append(
            len(name).to_bytes(2, "little")
            + name
            + p.version.to_bytes(4, "little")
            + len(p.body).to_bytes(8, "little")
            + p.body
        )
    return frames


def _configs(obj: Any, seen: set[int] | None = None) -> list[Any]:
    """Every DetectorConfig and RcaConfig reachable from ``obj``."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, np.ndarray)):
        return []
    seen.add(id(obj))
    if isinstance(obj, (DetectorConfig, RcaConfig)):
        return [obj, *_configs(getattr(obj, "rca", None), seen)]
    if isinstance(obj, dict):
        items: Any = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    return [c for v in items for c in _configs(v, seen)]


def test_every_reference_takes_the_current_config() -> None:
    back, kept = load_slot(dump_slot(JobSlot("j", 0, _engine(OLD))), 0, 1.0, NOW)
    engine = back.engine
    assert kept == set() and isinstance(engine, Analyzer)
    found = _configs(engine)  # each object once: no copy of an old one
    assert {id(c) for c in found} == {id(NOW), id(NOW.rca)}


def test_other_baseline_sizes_keep_the_snapshots_thresholds() -> None:
    now = DetectorConfig(baseline_window=32, hang_min_s=3.0, rca=NOW.rca)
    back, kept = load_slot(dump_slot(JobSlot("j", 0, _engine(OLD))), 0, 1.0, now)
    assert kept == {"baseline_window", "hang_min_s"}
    engine = back.engine
    assert isinstance(engine, Analyzer)
    assert engine.cfg.baseline_window == 64 and engine.cfg.hang_min_s == 2.0
    assert engine.cfg.rca is now.rca and engine.ctx.cfg is engine.cfg


def test_without_a_config_the_snapshot_keeps_its_own() -> None:
    back, kept = load_slot(dump_slot(JobSlot("j", 0, _engine(OLD))), 0, 1.0)
    assert kept == set() and back.engine.cfg == OLD  # type: ignore[attr-defined]


def test_the_router_restores_and_says_what_was_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    blob = dump_slot(JobSlot("j", 0, _engine(OLD), 0, 0.0))
    router = JobRouter(Analyzer, DetectorConfig(slow_of=7))
    with caplog.at_level(logging.WARNING):
        assert router.restore([("j", blob)], 0, 1.0) == 1
    engine = router.slots["j"].engine
    assert isinstance(engine, Analyzer) and engine.cfg.slow_of == 5
    assert "slow_of" in caplog.text and "hang_min_s" in caplog.text


def _causes(findings: list[Any]) -> list[tuple[str, int, list[tuple[int, str]]]]:
    return [
        (f.incident_id, f.revision, [(c.rank, c.component.value) for c in f.culprits])
        for f in findings
        if isinstance(f, RootCause)
    ]


def _run(slot: JobSlot, records: list[tuple[int, Any]]) -> list[Any]:
    out: list[Any] = []
    for i, (_, rec) in enumerate(records):
        slot.ingest(rec, wall_s=0.0)
        if i % 50 == 0:  # a worker's timer
            out += slot.advance(lambda _: "end", wall_s=0.0)
    return out + slot.advance(lambda _: "end", wall_s=0.0)


def test_a_restored_engine_gives_the_uninterrupted_verdicts() -> None:
    """Restored mid-incident (a slowdown open), the rest of the trace gives
    the same root causes and revisions."""
    records = _records(SLOW, seconds=6.0)
    once = JobSlot("j", 0, Analyzer("j"))
    expected = _run(once, records) + once.clock.finish(once.engine)
    assert _causes(expected), "the capped NIC has a root cause"
    found_ns = min(f.detected_ns for f in expected if isinstance(f, RootCause))
    split = next(
        i for i, (ts, _) in enumerate(records) if ts > found_ns + 1_000_000_000
    )
    first = JobSlot("j", 0, Analyzer("j"))
    before = _run(first, records[:split])
    assert first.engine.incident is not None  # type: ignore[attr-defined]
    back, _ = load_slot(dump_slot(first), 0, 0.0)
    after = _run(back, records[split:]) + back.clock.finish(back.engine)
    assert _causes(before + after) == _causes(expected)


def test_a_part_of_another_version_is_rebuilt_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(OLD, _records(SLOW))
    blob = dump_slot(JobSlot("j", 0, engine))
    bumped = tuple(replace(p, version=p.version + 1) if p.name == "baselines" else p
                   for p in snapshot_parts.PARTS)  # fmt: skip
    monkeypatch.setattr(snapshot_parts, "PARTS", bumped)
    with caplog.at_level(logging.WARNING):
        back = load_slot(blob, 0, 1.0)[0].engine
    assert isinstance(back, Analyzer)
    assert (
        "'baselines' rebuilt empty (part version 1, this release reads 2)"
        in caplog.text
    )
    assert not back.ctx.book.families or not any(  # type: ignore[attr-defined]
        len(f.rows)
        for f in back.ctx.book.families.values()  # type: ignore[attr-defined]
    )
    # The others survive: the open incident, the recent collectives, the hosts.
    assert back.incident is not None and engine.incident is not None
    assert back.incident.root_cause == engine.incident.root_cause
    assert len(back.stats) == len(engine.stats) > 0
    assert back.ctx.store.hosts.keys() == engine.ctx.store.hosts.keys()


def test_a_part_that_does_not_decode_is_rebuilt_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = _engine(OLD, _records(SLOW))
    blob = dump_slot(JobSlot("j", 0, engine))
    sealed = {p.name: p for p in decode_snapshot(zlib.decompress(blob))}
    cut = replace(sealed["recent"], body=sealed["recent"].body[:50])
    with caplog.at_level(logging.WARNING):
        back = load_slot(_reframe(blob, {"recent": cut}), 0, 1.0)[0].engine
    assert "'recent' rebuilt empty (does not decode" in caplog.text
    assert len(back.stats) == 0 and back.incident is not None  # type: ignore[attr-defined]
    assert back.ctx.topo.comms == engine.ctx.topo.comms  # type: ignore[attr-defined]


def test_a_snapshot_holds_no_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its parts are arrays without objects, scalars, strings and bytes, and
    it restores with every unpickler disabled."""
    engine = _engine(OLD, _records(SLOW))
    assert engine.incident is not None
    slot = JobSlot("j", 0, engine)
    for _, rec in _records(SLOW)[:50]:
        slot.ingest(rec, wall_s=0.0)  # records held by the clock
    blob = dump_slot(slot)
    names = set()
    for sealed in decode_snapshot(zlib.decompress(blob)):
        names.add(sealed.name)
        for key, value in sealed.open().fields.items():
            if isinstance(value, np.ndarray):
                assert not value.dtype.hasobject, (sealed.name, key)
            else:
                assert isinstance(value, (int, float, str, bytes, type(None))), key
            if isinstance(value, bytes):
                assert not value.startswith(b"\x80"), (sealed.name, key)  # a pickle
    assert {"slot", "clock", "config", "progress", "incidents", "recent"} <= names

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a snapshot was unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    back = load_slot(blob, 0, 1.0)[0]
    assert back.clock.pending == slot.clock.pending > 0
    assert back.engine.incident.root_cause == engine.incident.root_cause  # type: ignore[attr-defined]


class _Unpickled(Exception):
    pass


def _explode() -> None:
    raise _Unpickled


class _Trap:
    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _explode, ()


def test_an_old_pickled_snapshot_is_not_unpickled_and_the_job_starts_afresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = zlib.compress(pickle.dumps((24, "j", [], _Trap())), 1)
    router = JobRouter(Analyzer)
    with caplog.at_level(logging.WARNING):
        assert router.restore([("j", old)], 0, 1.0) == 1
    assert "pickled format of an older release, not read" in caplog.text
    engine = router.slots["j"].engine
    assert isinstance(engine, Analyzer) and engine.incident is None


def test_a_rebuilt_topology_is_fed_the_records_the_slot_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A job's topology is on a compacted topic, read once, long before the
    # committed offsets a restarted worker resumes from: the slot part keeps
    # the records, so an engine whose topology parts are rebuilt still knows
    # its ranks.
    out = ListWriter()
    simulate(SimConfig(tp=4, pp=2, dp=2, duration_s=3.0, seed=5), [], out)
    topology = [r for _, r in out.records if isinstance(r, Topology)]
    slot = JobSlot("j", 0, Analyzer("j"))
    for t in topology:
        slot.ingest(t, 0.0)
    slot.advance(lambda _: "end", 0.0)
    blob = dump_slot(slot)
    bumped = tuple(replace(p, version=9) if p.name in {"topology", "gate"} else p
                   for p in snapshot_parts.PARTS)  # fmt: skip
    monkeypatch.setattr(snapshot_parts, "PARTS", bumped)
    back = load_slot(blob, 0, 1.0)[0]
    assert back.topology.keys() == {t.host for t in topology}
    engine = back.engine
    assert isinstance(engine, Analyzer)
    assert len(topology) == 2  # noqa: PLR2004 - two hosts
    assert engine.gate.topo.world == 16  # noqa: PLR2004 - every rank declared
    assert len(engine.ctx.topo.rank_host) == 16  # noqa: PLR2004


def _feed(engine: Any, records: list[tuple[int, Any]]) -> list[str]:
    out: list[Any] = []
    for i, (ts, rec) in enumerate(records):
        engine.ingest(rec, ts)
        if i % 50 == 0:
            out += engine.evaluate(ts)
    return [repr(f) for f in out]


def test_a_comm_group_engine_restores_with_the_workers_factory() -> None:
    """A stage-1 engine (an analyzer and its own state): restored halfway, it
    sends the same summaries and findings as one never restored."""
    records = _records("gpu-hang:rank=5,at=2")
    factory = default_engine_factory("comm", 1)
    half = len(records) // 100 * 50  # on the evaluation timer
    once = factory("sim/0")
    expected = _feed(once, records)
    first = factory("sim/0")
    before = _feed(first, records[:half])
    back = load_slot(dump_slot(JobSlot("sim/0", 0, first)), 0, 0.0, factory=factory)
    engine: Any = back[0].engine
    assert type(engine) is type(once) and engine.cfg is engine.inner.cfg
    assert before + _feed(engine, records[half:]) == expected
