"""Whole-batch forms of the row checks, for the common all-valid batch.

``row_checks`` gives every row its reason code: some twenty numpy calls per
row group, most of a batch's gate cost, and almost always all zeros. The
functions here answer only "would every row get code 0?" with a few
reductions per group (a column's min or max against its bound, a min of
differences for the order rules). ``True`` implies that ``row_checks``
finds nothing; ``False`` sends the batch to the per-row checks, which name
the reason. They never disagree on what is valid: the per-row checks stay
the reference, and a test compares both on every broken-record category.
"""

from __future__ import annotations

import numpy as np

from mycroft.schemas.records import CompletionBatch, StateBatch
from mycroft.schemas.vocab import ALGORITHMS, DIRECTIONS, OP_NAMES, PROTOCOLS


def state_valid(b: StateBatch, lo: int, hi: int) -> bool:
    """Whether ``rc_codes``, ``op_codes`` and ``flow_codes`` are all 0."""
    return _rc(b.rc, lo, hi) and _op(b.op, lo, hi) and _flow(b.flow, lo, hi)


def done_valid(b: CompletionBatch, lo: int, hi: int) -> bool:
    """Whether ``done_op_codes`` and ``done_flow_codes`` are all 0."""
    return _done_op(b.op, lo, hi) and _done_flow(b.flow, lo, hi)


def _rc(rc: np.ndarray, lo: int, hi: int) -> bool:
    if not len(rc):
        return True
    done = rc["done_seq"]
    return bool(
        rc["rank"].min() >= 0
        and done.min() >= -1
        and _at_least(rc["issued_seq"], done)
        and _times(rc["seen_ns"], lo, hi, zero_ok=True)
    )


def _op(op: np.ndarray, lo: int, hi: int) -> bool:
    if not len(op):
        return True
    return bool(
        op["rank"].min() >= 0
        and op["seq"].min() >= 0
        and op["kind"].max() < len(OP_NAMES)
        and op["algo"].max() < len(ALGORITHMS)
        and op["proto"].max() < len(PROTOCOLS)
        and op["bytes"].min() >= 0
        and _times(op["issue_ns"], lo, hi, zero_ok=False)
        and _times(op["start_ns"], lo, hi, zero_ok=True)
    )


def _flow(flow: np.ndarray, lo: int, hi: int) -> bool:
    if not len(flow):
        return True
    g, t, d = flow["gpu_ready"], flow["transmitted"], flow["done"]
    return bool(
        _flow_codes_ok(flow)
        and d.min() >= 0
        and flow["ready_wait_us"].min() >= 0
        and _at_least(flow["total"], g)
        and _at_least(g, t)
        and _at_least(t, d)
        and _times(flow["last_ns"], lo, hi, zero_ok=True)
    )


def _done_op(op: np.ndarray, lo: int, hi: int) -> bool:
    if not len(op):
        return True
    issue, end = op["issue_ns"], op["end_ns"]
    return bool(
        op["rank"].min() >= 0
        and op["seq"].min() >= 0
        and op["kind"].max() < len(OP_NAMES)
        and op["bytes"].min() >= 0
        and _times(issue, lo, hi, zero_ok=False)
        and _times(end, lo, hi, zero_ok=False)
        and _times(op["start_ns"], lo, hi, zero_ok=True)
        and _at_least(end, issue)
    )


def _done_flow(flow: np.ndarray, lo: int, hi: int) -> bool:
    if not len(flow):
        return True
    first, last = flow["first_ns"], flow["last_ns"]
    return bool(
        _flow_codes_ok(flow)
        and flow["chunks"].min() >= 0
        and _times(first, lo, hi, zero_ok=True)
        and _times(last, lo, hi, zero_ok=True)
        and _at_least(last, first)
        and flow["wire_ns"].min() >= 0
    )


def _flow_codes_ok(flow: np.ndarray) -> bool:
    return bool(
        flow["peer"].min() >= 0
        and flow["dir"].max() < len(DIRECTIONS)
        and flow["channel"].min() >= 0
    )


def _at_least(a: np.ndarray, b: np.ndarray) -> bool:
    """``a >= b`` on every row (a comparison: no overflow at int64 extremes)."""
    return bool((a >= b).all())


def _times(t: np.ndarray, lo: int, hi: int, zero_ok: bool) -> bool:
    """``time_ok(t, lo, hi, zero_ok).all()`` from the column's min and max
    (and the min of its non-zero rows when some are 0 and that is allowed)."""
    if t.max() > hi:
        return False
    low = int(t.min())
    if low >= lo:
        return True
    if not zero_ok or low != 0:
        return False
    rest = t[t != 0]
    return not len(rest) or int(rest.min()) >= lo
