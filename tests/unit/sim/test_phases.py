"""The training loop's rhythm in the simulator, and what the core makes of it.

A rank-0 checkpoint that recurs pages at most once (its first pause, longer
than the hang threshold, cannot be told from a hang before it resolves),
is reported as a cost, and leaves a real hang after it detected as fast.
"""

from __future__ import annotations

import pytest

from mycroft.errors import ConfigError
from mycroft.producers.sim.config import DEFAULT_EPOCH_S, SimConfig, Workload
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.sim.phases import Phases
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.vocab import FaultKind
from mycroft.streams.analyze import Replay
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.snapshot_codec import decode_snapshot, encode_snapshot
from mycroft.streams.core.snapshot_parts import restore_engine, snapshot_engine

EVERY_S, PAUSE_S = 12.0, 3.0


def _run(phases: Phases, faults: tuple[str, ...] = (), seconds: float = 45.0):
    cfg = SimConfig(
        tp=8,
        pp=1,
        dp=2,
        duration_s=seconds,
        seed=3,
        workload=Workload(micro_batches=4),
        phases=phases,
    )
    replay = Replay()
    result = simulate(cfg, [parse_spec(f) for f in faults], replay)
    _, causes = replay.finish()
    start_s = cfg.start_ns / 1e9
    onsets = sorted(rc.onset_ns / 1e9 - start_s for rc in causes.values())
    return result, replay, causes, onsets


def test_phases_are_validated() -> None:
    with pytest.raises(ConfigError, match="--checkpoint-ranks"):
        Phases(checkpoint_ranks="rank1").validate()
    with pytest.raises(ConfigError, match="--resume-slowdown"):
        Phases(resume_slowdown=0.5).validate()


def test_a_rank0_checkpoint_rhythm_pages_once_and_is_a_cost() -> None:
    phases = Phases(EVERY_S, PAUSE_S, "rank0", resume_slowdown=1.5)
    result, replay, causes, onsets = _run(phases)
    kinds = [k for k, _ in result.phase_events]
    assert kinds == ["checkpoint"] * 3
    # The first pause only: every later one is the job's own rhythm.
    assert len(onsets) == 1 and EVERY_S <= onsets[0] < EVERY_S + PAUSE_S
    (cost,) = replay.analyzers["sim"].rhythm.costs()
    assert cost.holders == (0,) and cost.count == 3
    assert cost.mean_s == pytest.approx(PAUSE_S, abs=0.15)
    assert cost.every_s == pytest.approx(EVERY_S, abs=0.5)


def test_every_rank_checkpointing_and_evaluating_pages_nothing() -> None:
    phases = Phases(EVERY_S, PAUSE_S, "all", 7.0, 4, resume_slowdown=1.5)
    result, _, causes, _ = _run(phases)
    assert {k for k, _ in result.phase_events} == {"checkpoint", "eval"}
    assert causes == {}


def test_a_gpu_hang_after_the_rhythm_is_detected_as_before() -> None:
    phases = Phases(EVERY_S, PAUSE_S, "rank0")
    _, _, causes, onsets = _run(phases, ("gpu-hang:rank=3,at=40",), 46.0)
    late = [rc for rc in causes.values() if rc.onset_ns / 1e9 - DEFAULT_EPOCH_S >= 39.9]
    assert len(late) == 1 and late[0].kind is FaultKind.HANG
    assert late[0].culprits[0].rank == 3
    assert (late[0].detected_ns - late[0].onset_ns) / 1e9 <= 3.0


def _round_trip(engine: Analyzer, drop: str = "") -> Analyzer:
    """``engine`` through a worker's snapshot encoding (without part ``drop``,
    as a snapshot from before that part existed)."""
    data = encode_snapshot([p for p in snapshot_engine(engine) if p.name != drop])
    back = restore_engine(engine.ctx.job_id, decode_snapshot(data), None)
    restored: Analyzer = back.engine
    return restored


def test_the_rhythm_survives_a_snapshot_mid_job() -> None:
    """An engine snapshotted and restored between two pauses (as a worker's
    snapshot is) reaches the verdicts and costs of one never restored; a
    snapshot from before the rhythm existed restores with an empty one."""
    phases = Phases(EVERY_S, PAUSE_S, "rank0")
    cfg = SimConfig(tp=8, pp=1, dp=2, duration_s=40.0, seed=3, phases=phases)
    records = ListWriter()
    simulate(cfg, [], records)
    cut = cfg.start_ns + int((2 * EVERY_S - 2) * 1e9)  # after the first pause
    whole, restored = Replay(), Replay()
    for ts, rec in records.records:
        if ts >= cut and not restored.analyzers["sim"].rhythm.open:
            restored.analyzers["sim"] = _round_trip(restored.analyzers["sim"])
            cut = 2**63 - 1
        whole.feed(ts, rec)
        restored.feed(ts, rec)
    assert restored.finish()[1] == whole.finish()[1]
    costs = restored.analyzers["sim"].rhythm.costs()
    assert costs == whole.analyzers["sim"].rhythm.costs() and costs[0].count == 3
    back = _round_trip(restored.analyzers["sim"], drop="rhythm")
    assert back.rhythm.costs() == []
