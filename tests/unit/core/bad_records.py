"""Valid-Avro-but-wrong records for the input-contract tests and benchmark.

Each category takes a valid record of the scripted job (``scenario.py``) and
breaks one rule of the contract (``streams/core/contract.py``); hypothesis
strategies draw the broken values. Every record still encodes and decodes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from mycroft.schemas.records import BatchHeader, CompletionBatch, StateBatch
from mycroft.streams.core.contract import Contract, Reason

I64 = np.iinfo(np.int64)
I32 = np.iinfo(np.int32)
NR = 8  # ranks of the scripted job
OLDEST = Contract().min_time_ns


def _copy(b: StateBatch | CompletionBatch, seq: int) -> StateBatch | CompletionBatch:
    """A copy with fresh arrays and an agent_seq the job never used."""
    h = replace(b.header, agent_seq=seq)
    if isinstance(b, StateBatch):
        return StateBatch(h, b.rc.copy(), b.op.copy(), b.flow.copy())
    return CompletionBatch(h, b.op.copy(), b.flow.copy())


def _rows(b) -> int:
    groups = (b.op, b.flow) + ((b.rc,) if isinstance(b, StateBatch) else ())
    return sum(len(g) for g in groups)


def _with_header(b, seq: int, **kw) -> StateBatch | CompletionBatch:
    out = _copy(b, seq)
    out.header = BatchHeader(**{**out.header.__dict__, **kw})
    return out


def bad_rank(b, seq: int, rank: int):
    """A rank outside the job (negative or >= the world size)."""
    out = _copy(b, seq)
    group = out.rc if isinstance(out, StateBatch) else out.op
    group["rank"][0] = rank
    return out


def bad_peer(b, seq: int, peer: int):
    out = _copy(b, seq)
    out.flow["peer"][0] = peer
    return out


def bad_tick(b, seq: int, tick: int):
    return _with_header(b, seq, tick_ns=tick)


def bad_counters(b, seq: int, done: int):
    """``done`` above ``transmitted`` (or negative): breaks G >= T >= D >= 0."""
    out = _copy(b, seq)
    f = out.flow
    f["done"][0] = done
    return out


def bad_nflows(b, seq: int, delta: int):
    out = _copy(b, seq)
    out.op["nflows"][0] += delta
    return out


def bad_seq(b, seq: int, value: int):
    out = _copy(b, seq)
    out.rc["done_seq"][0] = value
    return out


def bad_row_time(b, seq: int, t: int):
    out = _copy(b, seq)
    out.op["issue_ns"][0] = t
    return out


def empty_state(b, seq: int, _: int):
    out = _copy(b, seq)
    return StateBatch(out.header, out.rc[:0], out.op[:0], out.flow[:0])


def unknown_comm(b, seq: int, comm: int):
    out = _copy(b, seq)
    out.rc["comm"][:] = comm
    return out


CATEGORIES = {
    # name: (mutation, strategy of the broken value, reasons it may get)
    "rank-negative": (
        bad_rank,
        st.integers(I32.min, -1),
        {Reason.RANK_RANGE},
    ),
    "rank-beyond-world": (
        bad_rank,
        st.integers(NR, I32.max),
        {Reason.RANK_RANGE, Reason.UNKNOWN_RANK},
    ),
    "peer-outside-comm": (
        bad_peer,
        st.one_of(st.integers(I32.min, -1), st.integers(NR, I32.max)),
        {Reason.RANK_RANGE},
    ),
    "tick-implausible": (
        bad_tick,
        st.one_of(st.integers(I64.min, OLDEST - 1), st.integers(5 * 10**18, I64.max)),
        {Reason.TIME_RANGE},
    ),
    "tick-jump": (
        bad_tick,
        st.integers(2 * 10**18, 4 * 10**18),
        {Reason.TIME_JUMP, Reason.CLOCK_SKEW},
    ),
    "counter-order": (
        bad_counters,
        st.one_of(st.integers(I32.min, -1), st.integers(17, I32.max)),
        {Reason.COUNTER_ORDER},
    ),
    "layout": (
        bad_nflows,
        st.one_of(st.integers(-(10**6), -1), st.integers(1, 10**6)),
        {Reason.LAYOUT},
    ),
    "seq": (bad_seq, st.integers(I64.min, -2), {Reason.BAD_SEQ}),
    "row-time": (
        bad_row_time,
        st.one_of(st.integers(I64.min, OLDEST - 1), st.integers(5 * 10**18, I64.max)),
        {Reason.ROW_TIME},
    ),
    "empty-state": (empty_state, st.just(0), {Reason.EMPTY_STATE}),
    "unknown-comm": (
        unknown_comm,
        st.integers(0x1000, 2**64 - 1),
        {Reason.UNKNOWN_RANK},
    ),
}
"""Categories of wrong records; the rank, peer, counter and time ones apply to
state batches (``bad_rank`` also to completions)."""
