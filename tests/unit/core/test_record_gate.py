"""The input contract: wrong records never reach state, crash, or name a culprit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mycroft.errors import DecodeError
from mycroft.schemas.codec import Codec
from mycroft.schemas.columns import DONE_OP_COLUMNS, empty
from mycroft.schemas.records import (
    CompletionBatch,
    Heartbeat,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.streams.core.contract import Contract, Reason
from mycroft.streams.core.record_gate import RecordGate
from mycroft.streams.faust_runtime import rank_chunks
from tests.unit.core import bad_records as bad
from tests.unit.core.scenario import (
    NR,
    T0,
    best_culprit,
    full_batch,
    make,
    run_analyzer,
)
from tests.unit.core.snapshot_roundtrip import roundtrip_engine
from tests.unit.samples import all_records

CODEC = Codec()
HANG = make("gpu-hang", 3)  # rank 3 on host h1 hangs at ~6 s


CLEAN = best_culprit(run_analyzer(HANG)[1])


def _inject(records, at_ns, extra):
    """``records`` with ``extra`` records (round-tripped through the codec)
    inserted at trace time ``at_ns``."""
    wire = [(at_ns, CODEC.decode(CODEC.encode(r))) for r in extra]
    out = [(t, r) for t, r in records if t < at_ns]
    return out + wire + [(t, r) for t, r in records if t >= at_ns]


def _named_ranks(out):
    return {c.rank for f in out if isinstance(f, RootCause) for c in f.culprits}


def _check_culprit_kept(extra, at_ns, reasons):
    an, out = run_analyzer(_inject(HANG, at_ns, extra))
    assert best_culprit(out) == CLEAN
    assert _named_ranks(out) <= set(range(NR))
    got = {Reason(r) for r, _ in an.gate.counts}
    assert got and got <= reasons, an.gate.counts
    for f in out:  # every finding still encodes
        CODEC.encode(f)
    return an


def test_completion_row_with_rank_minus_one_is_rejected_and_rates_survive():
    ts, b = full_batch(HANG, CompletionBatch, after_ns=T0 + 4 * 10**9)
    wrong = bad.bad_rank(b, 10**6, -1)
    one = replace(wrong, op=wrong.op[1:], flow=wrong.flow[1:])
    assert rank_chunks([wrong]) == rank_chunks([one])
    wrong.op["rank"][:] = -1
    _check_culprit_kept([wrong], ts, {Reason.RANK_RANGE})


def test_tick_at_int64_max_is_rejected_and_findings_still_encode():
    ts, b = full_batch(HANG)
    _check_culprit_kept(
        [bad.bad_tick(b, 10**6, bad.I64.max)], ts, {Reason.TIME_RANGE}
    )


def test_a_host_clock_jumping_from_1970_to_now_never_breaks_evaluation():
    _, b = full_batch(HANG, host="h2", after_ns=T0)
    old = bad.bad_tick(b, 10**6, 1_000)
    old.rc["seen_ns"] = 1_000
    old.op["issue_ns"] = 500
    old.op["start_ns"] = 0
    old.flow["last_ns"] = 0
    _check_culprit_kept([old], T0, {Reason.TIME_RANGE})


def test_rows_of_a_comm_outside_the_topology_are_held_then_rejected():
    ts, b = full_batch(HANG)
    an = _check_culprit_kept(
        [bad.unknown_comm(b, 10**6, 0xDEAD)], ts, {Reason.UNKNOWN_RANK}
    )
    assert not an.gate.held


def test_rank_beyond_the_world_never_becomes_a_culprit():
    ts, b = full_batch(HANG, after_ns=T0 + 6_500_000_000)
    wrong = bad.bad_rank(b, 10**6, 119)
    wrong.op["rank"][:] = 119
    _check_culprit_kept([wrong], ts, {Reason.RANK_RANGE})


def test_rank_of_another_host_is_rejected():
    ts, b = full_batch(HANG, host="h0", after_ns=T0 + 6_500_000_000)
    wrong = bad.bad_rank(b, 10**6, 3)  # rank 3 runs on h1
    _check_culprit_kept([wrong], ts, {Reason.RANK_NOT_ON_HOST})


def test_empty_state_batch_from_the_culprits_host_changes_nothing():
    ts, b = full_batch(HANG, after_ns=T0 + 6_500_000_000)
    empties = [bad.empty_state(b, 10**6 + i, 0) for i in range(5)]
    for i, e in enumerate(empties):
        e.header = replace(e.header, tick_ns=e.header.tick_ns + i * 100_000_000)
    _check_culprit_kept(empties, ts, {Reason.EMPTY_STATE})


def test_rows_wait_for_a_late_topology_and_then_count():
    topo = [r for _, r in HANG if isinstance(r, Topology)]
    rest = [(t, r) for t, r in HANG if not isinstance(r, Topology)]
    first = rest[0][0]
    late = [(t, r) for t, r in rest if t < first + 1_000_000_000]
    late += [(first + 1_000_000_000, t) for t in topo]
    late += [(t, r) for t, r in rest if t >= first + 1_000_000_000]
    an, out = run_analyzer(late)
    assert not an.gate.counts
    assert best_culprit(out) == CLEAN


def test_held_rows_are_bounded_in_count():
    gate = RecordGate(Contract(max_held=3))
    _, b = full_batch(HANG)
    for i in range(5):
        gate.admit(bad.bad_tick(b, i, b.header.tick_ns + i), b.header.tick_ns)
    assert len(gate.held) == 3
    assert gate.counts[(Reason.HOLD_OVERFLOW.value, "undeclared")] == 2


def test_counters_going_down_on_a_flow_are_rejected():
    topo = [r for _, r in HANG if isinstance(r, Topology)]
    gate = RecordGate()
    for t in topo:
        gate.admit(t, T0)
    _, b = full_batch(HANG)
    b.flow["gpu_ready"][0] = b.flow["transmitted"][0] = b.flow["done"][0] = 3
    b.flow["total"][0] = 16
    assert gate.admit(b, b.header.tick_ns)
    later = bad.bad_tick(b, 10**6, b.header.tick_ns + 100_000_000)
    later.flow["done"][0] = later.flow["transmitted"][0] = 2
    assert gate.admit(later, later.header.tick_ns) == []  # a snapshot: whole
    (r,) = gate.take()
    assert (r.reason, r.rows) == (Reason.COUNTER_REGRESS, bad._rows(later))


def test_a_host_sending_invalid_data_is_flagged_once():
    topo = [r for _, r in HANG if isinstance(r, Topology)]
    gate = RecordGate(Contract(flag_after=3))
    for t in topo:
        gate.admit(t, T0)
    _, b = full_batch(HANG)
    for i in range(4):
        gate.admit(bad.bad_rank(b, i, -5), b.header.tick_ns)
    assert gate.flagged == {"h1"} and gate.newly_flagged == ["h1"]


def test_bad_topology_records_are_rejected_whole():
    topo = next(r for _, r in HANG if isinstance(r, Topology))
    rt = topo.ranks[0]
    m = replace(rt.comms[0], comm_rank=5)
    wrong = replace(topo, ranks=(replace(rt, comms=(m,)), *topo.ranks[1:]))
    gate = RecordGate()
    assert gate.admit(wrong, T0) == []
    assert gate.take()[0].reason is Reason.BAD_TOPOLOGY


def test_tombstone_host_left_rows_are_no_longer_placed():
    topo = [r for _, r in HANG if isinstance(r, Topology)]
    gate = RecordGate()
    for t in topo:
        gate.admit(t, T0)
    gate.host_left("h1")
    _, b = full_batch(HANG)
    assert gate.admit(b, b.header.tick_ns) == []
    gate.expire(b.header.tick_ns + Contract().hold_ns + 1)
    assert {r.reason for r in gate.take()} == {Reason.UNKNOWN_RANK}


def test_huge_batch_is_rejected_whole_with_a_reason():
    _, b = full_batch(HANG)
    big = StateBatch(b.header, np.resize(b.rc, 250_000), b.op, b.flow)
    gate = RecordGate()
    assert gate.admit(big, b.header.tick_ns) == []
    (r,) = gate.take()
    assert (r.reason, r.rows) == (Reason.TOO_LARGE, 250_000 + len(b.op) + len(b.flow))


def test_heartbeat_with_negative_rank_or_bad_time_is_rejected():
    hb = next(r for r in all_records() if isinstance(r, Heartbeat))
    gate = RecordGate()
    assert gate.admit(hb, hb.ts_ns) == [hb]
    assert gate.admit(replace(hb, ts_ns=-1), T0) == []
    health = replace(hb.ranks[0], rank=-3) if hb.ranks else None
    if health is not None:
        assert gate.admit(replace(hb, ranks=(health,)), hb.ts_ns) == []
    assert [r.reason for r in gate.take()][0] is Reason.TIME_RANGE


def test_completion_batch_flows_of_a_bad_op_leave_with_it():
    _, b = full_batch(HANG, CompletionBatch, after_ns=T0 + 4 * 10**9)
    topo = [r for _, r in HANG if isinstance(r, Topology)]
    gate = RecordGate()
    for t in topo:
        gate.admit(t, T0)
    wrong = bad.bad_rank(b, 10**6, -1)
    (kept,) = gate.admit(wrong, b.header.tick_ns)
    assert len(kept.op) == len(b.op) - 1
    assert len(kept.flow) == len(b.flow) - int(b.op["nflows"][0])
    assert int(kept.op["nflows"].sum()) == len(kept.flow)


_STATE_CATS = sorted(bad.CATEGORIES)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.sampled_from(_STATE_CATS), st.data())
def test_every_wrong_state_record_is_rejected_and_the_rest_is_valid(name, data):
    mutate, values, reasons = bad.CATEGORIES[name]
    topo = [r for _, r in HANG if isinstance(r, Topology)]
    gate = RecordGate()
    for t in topo:
        gate.admit(t, T0)
    ts, b = full_batch(HANG)
    gate.admit(b, ts)
    wrong = mutate(b, 10**6, data.draw(values))
    wrong = CODEC.decode(CODEC.encode(wrong))  # valid Avro
    kept = gate.admit(wrong, ts + 100_000_000)
    gate.expire(ts + 100_000_000 + Contract().hold_ns + 1)
    got = {r.reason for r in gate.take()}
    assert got and got <= reasons
    for part in kept:  # what passes passes again on a fresh gate
        again = RecordGate()
        for t in topo:
            again.admit(t, T0)
        again.admit(part, ts)
        assert not again.take()


@settings(max_examples=6, deadline=None)
@given(st.lists(st.sampled_from(_STATE_CATS), min_size=3, max_size=8), st.data())
def test_wrong_records_amid_a_hang_never_change_the_culprit(names, data):
    ts, b = full_batch(HANG, after_ns=T0 + 6_500_000_000)
    extra, reasons = [], set()
    for i, name in enumerate(names):
        mutate, values, why = bad.CATEGORIES[name]
        extra.append(mutate(b, 10**6 + i, data.draw(values)))
        reasons |= why
    _check_culprit_kept(extra, ts, reasons | {Reason.CLOCK_SKEW, Reason.TIME_JUMP})


def test_done_rows_of_an_unknown_rank_do_not_crash_rates():
    b = CompletionBatch(
        full_batch(HANG, CompletionBatch)[1].header, empty(DONE_OP_COLUMNS, 1)
    )
    b.op["rank"] = -7
    b.op["nflows"] = 0
    assert rank_chunks([b]) == {}


@pytest.mark.parametrize("reason", list(Reason))
def test_every_reason_is_documented(reason):
    readme = Path(__file__).parents[3] / "streams" / "core" / "README.md"
    assert f"`{reason.value}`" in readme.read_text("utf-8")


def test_null_value_is_a_decode_error_with_its_reason():
    with pytest.raises(DecodeError) as err:
        CODEC.decode(None)
    assert err.value.reason == "null-value"
    with pytest.raises(DecodeError) as err:
        CODEC.decode_datum("text")  # type: ignore[arg-type]
    assert err.value.reason == "not-avro"


def test_the_gate_survives_a_snapshot_without_its_batch_caches():
    an, _ = run_analyzer(HANG[: len(HANG) // 2])
    back = roundtrip_engine(an)
    assert back.gate.topo.world == NR and back.gate._keys[0] is None
    ts, b = full_batch(HANG, after_ns=T0 + 7 * 10**9)
    back.ingest(bad.bad_rank(b, 10**6, -4), ts)
    assert [r.reason for r in back.gate.take()] == [Reason.RANK_RANGE]
