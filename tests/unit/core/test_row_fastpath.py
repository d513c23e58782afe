"""The whole-batch checks agree with the per-row reference on any one field."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mycroft.schemas.records import CompletionBatch, StateBatch, Topology
from mycroft.streams.core import row_checks as rows
from mycroft.streams.core import row_fastpath as fast
from mycroft.streams.core.contract import Contract
from mycroft.streams.core.record_gate import RecordGate
from tests.unit.core.scenario import full_batch, make

RECORDS = make("gpu-hang", 3)
STATE = full_batch(RECORDS, StateBatch)[1]
DONE = full_batch(RECORDS, CompletionBatch)[1]
C = Contract()


def _bounds(b: StateBatch | CompletionBatch) -> tuple[int, int]:
    return C.min_time_ns, b.header.tick_ns + C.row_slack_ns


def _reference(b: StateBatch | CompletionBatch) -> bool:
    lo, hi = _bounds(b)
    if isinstance(b, StateBatch):
        codes = [
            rows.rc_codes(b.rc, lo, hi),
            rows.op_codes(b.op, lo, hi),
            rows.flow_codes(b.flow, lo, hi),
        ]
    else:
        codes = [rows.done_op_codes(b.op, lo, hi), rows.done_flow_codes(b.flow, lo, hi)]
    return not any(c.any() for c in codes)


def _fast(b: StateBatch | CompletionBatch) -> bool:
    lo, hi = _bounds(b)
    if isinstance(b, StateBatch):
        return fast.state_valid(b, lo, hi)
    return fast.done_valid(b, lo, hi)


def _groups(b: StateBatch | CompletionBatch) -> dict[str, np.ndarray]:
    out = {"op": b.op, "flow": b.flow}
    if isinstance(b, StateBatch):
        out["rc"] = b.rc
    return out


def _copy(b: StateBatch | CompletionBatch) -> StateBatch | CompletionBatch:
    if isinstance(b, StateBatch):
        return StateBatch(b.header, b.rc.copy(), b.op.copy(), b.flow.copy())
    return CompletionBatch(b.header, b.op.copy(), b.flow.copy())


def _value(dtype: np.dtype, lo: int, hi: int) -> st.SearchStrategy[int]:
    info = np.iinfo(dtype)
    near = [0, -1, 1, lo - 1, lo, hi, hi + 1, info.min, info.max]
    special = st.sampled_from([v for v in near if info.min <= v <= info.max])
    return st.one_of(special, st.integers(int(info.min), int(info.max)))


def test_the_scenario_batches_are_valid_both_ways():
    for b in (STATE, DONE):
        assert _reference(b) and _fast(b)


def test_a_negative_wire_time_is_a_bad_row_both_ways():
    b = _copy(DONE)
    b.flow["wire_ns"][0] = -1
    assert not _reference(b) and not _fast(b)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([STATE, DONE]), st.data())
def test_one_changed_field_gets_the_same_answer(base, data):
    b = _copy(base)
    groups = _groups(b)
    group = groups[data.draw(st.sampled_from(sorted(groups)))]
    name = data.draw(st.sampled_from(group.dtype.names))
    row = data.draw(st.integers(0, len(group) - 1))
    lo, hi = _bounds(b)
    group[name][row] = data.draw(_value(group.dtype[name], lo, hi))
    assert _fast(b) == _reference(b)


def test_the_gate_takes_a_clean_batch_without_the_per_row_checks():
    gate = RecordGate()
    for t in (r for _, r in RECORDS if isinstance(r, Topology)):
        gate.admit(t, t.ts_ns)
    assert gate._clean(STATE) and gate._clean(DONE)
    moved = _copy(STATE)
    moved.rc["rank"][0] = (int(moved.rc["rank"][0]) + 4) % 8  # another host's rank
    assert not gate._clean(moved)
