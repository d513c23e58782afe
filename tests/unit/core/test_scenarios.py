"""Each fault's signature in, the right culprit out; silence on healthy runs."""

from __future__ import annotations

import json

import pytest

from mycroft.producers.tracefile import TraceFileWriter
from mycroft.schemas.records import Anomaly, RootCause
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams import analyze
from mycroft.streams.core import incidents
from mycroft.streams.core.engine import Analyzer
from tests.unit.core.scenario import T0, host_of, make


def _run(records, step_ns=100_000_000):
    an = Analyzer("job1")
    out, nxt = [], T0
    for ts, rec in records:
        while nxt <= ts:
            out += an.evaluate(nxt)
            nxt += step_ns
        an.ingest(rec, ts)
    return an, out


def _causes(out):
    return [f for f in out if isinstance(f, RootCause)]


@pytest.mark.parametrize(
    ("kind", "component", "fkind", "peer"),
    [
        ("gpu-hang", Component.GPU, FaultKind.HANG, None),
        ("nic-down", Component.NIC, FaultKind.HANG, 5),
        ("process-crash", Component.PROCESS, FaultKind.HANG, None),
        ("host-stall", Component.HOST, FaultKind.HANG, None),
        ("mismatch", Component.CONFIG, FaultKind.MISMATCH, None),
        ("gpu-power-cap", Component.GPU, FaultKind.SLOWDOWN, None),
        ("nic-bandwidth", Component.NIC, FaultKind.SLOWDOWN, 5),
        ("network", Component.NETWORK, FaultKind.SLOWDOWN, None),
        ("pcie", Component.PCIE, FaultKind.SLOWDOWN, None),
    ],
)
def test_fault_culprit(kind, component, fkind, peer):
    _, out = _run(make(kind, 3))
    causes = _causes(out)
    assert causes, f"no root cause for {kind}"
    first = causes[0]
    best = first.culprits[0]
    # A host-wide fault (network) names a rank of the host.
    named = host_of(best.rank) if kind == "network" else best.rank
    want = host_of(3) if kind == "network" else 3
    assert (named, best.component, first.kind) == (want, component, fkind)
    if peer is not None:
        assert best.peer == peer and best.channel is not None
    assert len({c.incident_id for c in causes}) == 1
    onset = T0 + 6e9
    assert first.detected_ns - onset < (3e9 if fkind is FaultKind.HANG else 10e9)


@pytest.mark.parametrize("kw", [{}, {"slow_rank": 5}, {"bubble_ms": 120}])
def test_healthy_is_silent(kw):
    _, out = _run(make("none", seconds=12.0, seed=7, **kw))
    assert not [f for f in out if isinstance(f, Anomaly | RootCause)]


def test_duplicates_ignored_and_no_repeats():
    recs = make("gpu-hang", 3)
    doubled = [x for pair in zip(recs, recs, strict=True) for x in pair]
    an, out = _run(doubled)
    assert an.duplicates > 0
    causes = _causes(out)
    assert [c.revision for c in causes] == list(range(len(causes)))
    ids = [a.anomaly_id for a in out if isinstance(a, Anomaly)]
    assert len(ids) == len(set(ids))


def test_analyze_cli_json(tmp_path, capsys):
    path = tmp_path / "t.trace"
    with TraceFileWriter(path) as w:
        for ts, rec in make("process-crash", 3, seconds=10.0):
            w.write(rec, ts)
    assert analyze.main([str(path), "--json"]) == 3  # a root cause found
    doc = json.loads(capsys.readouterr().out)
    best = doc["root_causes"][0]
    assert (best["rank"], best["component"], best["kind"]) == (3, "process", "hang")
    assert best["detected_at_s"] > T0 / 1e9
    assert doc["anomalies"]


def test_analyze_cli_detector_overrides(tmp_path, capsys):
    """``--set`` reaches the detectors: with incidents allowed one published
    anomaly, fewer are published; a bad key is a usage error naming it."""
    path = tmp_path / "t.trace"
    with TraceFileWriter(path) as w:
        for ts, rec in make("process-crash", 3, seconds=10.0):
            w.write(rec, ts)
    analyze.main([str(path), "--json"])
    plain = json.loads(capsys.readouterr().out)
    analyze.main([str(path), "--json", "--set", "incident_max_anomalies=1"])
    capped = json.loads(capsys.readouterr().out)
    assert len(plain["anomalies"]) > 1 and len(capped["anomalies"]) == 1
    assert capped["root_causes"][0]["rank"] == plain["root_causes"][0]["rank"]
    analyze.main([str(path), "--json", "--set", "rca.max_confidence=0.7"])
    (unsure, *_) = json.loads(capsys.readouterr().out)["root_causes"]
    assert plain["root_causes"][0]["confidence"] > 0.7 >= unsure["confidence"]
    assert unsure["rank"] == plain["root_causes"][0]["rank"]
    for bad in ("hang_soon=1", "rca.weight.hang_soon=1"):
        with pytest.raises(SystemExit) as exit_:
            analyze.main([str(path), "--set", bad])
        assert exit_.value.code == 2
        assert "hang_soon" in capsys.readouterr().err


_EXPLAIN = Analyzer.explain


def _refreshes(monkeypatch, kind):
    """Times of the root-cause refreshes of ``kind``'s scenario, and its
    root causes."""
    times: list[int] = []

    def spy(self, inc, fkind, now_ns):
        times.append(now_ns)
        return _EXPLAIN(self, inc, fkind, now_ns)

    monkeypatch.setattr(Analyzer, "explain", spy)
    _, out = _run(make(kind, 3, seconds=24.0))
    return times, _causes(out)


def test_a_slowdown_that_holds_is_refreshed_less_often(monkeypatch):
    times, causes = _refreshes(monkeypatch, "gpu-power-cap")
    gaps = [round((b - a) / 1e9, 1) for a, b in zip(times, times[1:], strict=False)]
    assert {2.0, 4.0} <= set(gaps), gaps
    assert max(gaps) <= 4.0
    # Every second, as before the back-off: the same answers, more work.
    monkeypatch.setattr(incidents, "REEVAL_MAX_NS", incidents.REEVAL_NS)
    every_s, same = _refreshes(monkeypatch, "gpu-power-cap")
    assert len(every_s) > len(times)
    assert [
        (c.revision, c.culprits[0].rank, c.culprits[0].component) for c in causes
    ] == [(c.revision, c.culprits[0].rank, c.culprits[0].component) for c in same]


def test_a_hang_is_refreshed_every_second(monkeypatch):
    times, _ = _refreshes(monkeypatch, "gpu-hang")
    gaps = {round((b - a) / 1e9, 1) for a, b in zip(times, times[1:], strict=False)}
    assert gaps == {1.0}
