"""Columnar row checks of the input contract: one reason code per row.

Every function takes a row group's structured array and returns a ``uint8``
array of codes, ``0`` for a valid row, else ``1 + CODES.index(reason)`` of
the first rule the row breaks. Nothing loops over rows in Python.
"""

from __future__ import annotations

import numpy as np

from mycroft.schemas.vocab import ALGORITHMS, DIRECTIONS, OP_NAMES, PROTOCOLS
from mycroft.streams.core.contract import Reason

CODES: tuple[Reason, ...] = tuple(Reason)
"""Reason of code ``c`` (``c >= 1``): ``CODES[c - 1]``."""

_MIX = np.uint64(0x9E3779B97F4A7C15)


_CODE = {r: i + 1 for i, r in enumerate(CODES)}


def code(reason: Reason) -> int:
    """The row code of ``reason``."""
    return _CODE[reason]


def mark(codes: np.ndarray, bad: np.ndarray, reason: Reason) -> None:
    """Give ``reason`` to the rows of ``bad`` that have no reason yet (the
    common case, no bad row, costs one reduction)."""
    if bad.any():
        codes[(codes == 0) & bad] = _CODE[reason]


def pair_keys(rank: np.ndarray, comm: np.ndarray) -> np.ndarray:
    """One uint64 per (rank, comm) for set lookups (collisions: ~2^-64)."""
    r = rank.astype(np.int64).astype(np.uint64)
    return comm.astype(np.uint64) ^ (r * _MIX)


def isin_sorted(keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``keys`` in the sorted, unique ``table``."""
    if not len(table):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(table, keys), len(table) - 1)
    return np.asarray(table[at] == keys)


def time_ok(t: np.ndarray, lo: int, hi: int, zero_ok: bool) -> np.ndarray:
    """Times within ``[lo, hi]`` (or ``0``, "none", when ``zero_ok``).

    One wrapping subtraction: ``t - lo`` modulo 2**64 is at most ``hi - lo``
    exactly for ``t`` in ``[lo, hi]``, int64 extremes included.
    """
    span = np.uint64(hi - lo)
    ok = np.asarray((t.astype(np.int64) - np.int64(lo)).view(np.uint64) <= span)
    if zero_ok and not ok.all():
        ok |= t == 0
    return ok


def rc_codes(rc: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Topology-free checks of rank-state rows (times within ``[lo, hi]``)."""
    out = np.zeros(len(rc), dtype=np.uint8)
    mark(out, rc["rank"] < 0, Reason.RANK_RANGE)
    issued, done = rc["issued_seq"], rc["done_seq"]
    mark(out, (issued < -1) | (done < -1) | (done > issued), Reason.BAD_SEQ)
    mark(out, ~time_ok(rc["seen_ns"], lo, hi, True), Reason.ROW_TIME)
    return out


def op_codes(op: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Topology-free checks of in-flight op rows."""
    out = np.zeros(len(op), dtype=np.uint8)
    mark(out, op["rank"] < 0, Reason.RANK_RANGE)
    mark(out, op["seq"] < 0, Reason.BAD_SEQ)
    bad_code = (
        (op["kind"] >= len(OP_NAMES))
        | (op["algo"] >= len(ALGORITHMS))
        | (op["proto"] >= len(PROTOCOLS))
        | (op["bytes"] < 0)
    )
    mark(out, bad_code, Reason.BAD_CODE)
    issue = op["issue_ns"]
    mark(out, ~time_ok(issue, lo, hi, False), Reason.ROW_TIME)
    mark(out, ~time_ok(op["start_ns"], lo, hi, True), Reason.ROW_TIME)
    return out


def flow_codes(flow: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Topology-free checks of in-flight flow rows (counters cumulative)."""
    out = np.zeros(len(flow), dtype=np.uint8)
    mark(out, flow["peer"] < 0, Reason.RANK_RANGE)
    bad = (flow["dir"] >= len(DIRECTIONS)) | (flow["channel"] < 0)
    mark(out, bad | (flow["ready_wait_us"] < 0), Reason.BAD_CODE)
    g, t, d = flow["gpu_ready"], flow["transmitted"], flow["done"]
    order = (flow["total"] >= g) & (g >= t) & (t >= d) & (d >= 0)
    mark(out, ~order, Reason.COUNTER_ORDER)
    mark(out, ~time_ok(flow["last_ns"], lo, hi, True), Reason.ROW_TIME)
    return out


def done_op_codes(op: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Topology-free checks of completed op rows."""
    out = np.zeros(len(op), dtype=np.uint8)
    mark(out, op["rank"] < 0, Reason.RANK_RANGE)
    mark(out, op["seq"] < 0, Reason.BAD_SEQ)
    mark(out, (op["kind"] >= len(OP_NAMES)) | (op["bytes"] < 0), Reason.BAD_CODE)
    issue, end = op["issue_ns"], op["end_ns"]
    times = time_ok(issue, lo, hi, False) & time_ok(end, lo, hi, False)
    times &= time_ok(op["start_ns"], lo, hi, True) & (end >= issue)
    mark(out, ~times, Reason.ROW_TIME)
    return out


def done_flow_codes(flow: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Topology-free checks of completed flow rows."""
    out = np.zeros(len(flow), dtype=np.uint8)
    mark(out, flow["peer"] < 0, Reason.RANK_RANGE)
    bad = (flow["dir"] >= len(DIRECTIONS)) | (flow["channel"] < 0)
    mark(out, bad | (flow["chunks"] < 0), Reason.BAD_CODE)
    first, last = flow["first_ns"], flow["last_ns"]
    times = time_ok(first, lo, hi, True) & time_ok(last, lo, hi, True)
    mark(out, ~(times & (last >= first)) | (flow["wire_ns"] < 0), Reason.ROW_TIME)
    return out


def owners(nflows: np.ndarray, n_flow: int) -> np.ndarray | None:
    """Op index of each flow row, or ``None`` when ``nflows`` does not lay
    out exactly ``n_flow`` rows (a negative count, or a wrong sum)."""
    counts = nflows.astype(np.int64)
    if (counts < 0).any() or int(counts.sum()) != n_flow:
        return None
    return np.repeat(np.arange(len(counts)), counts)


def fold_flows(op_code: np.ndarray, flow_code: np.ndarray, owner: np.ndarray) -> None:
    """An op takes the reason of its first bad flow; its flows that of the op."""
    bad = np.flatnonzero(flow_code)
    if len(bad):
        first = bad[np.unique(owner[bad], return_index=True)[1]]
        ops = owner[first]
        free = op_code[ops] == 0
        op_code[ops[free]] = flow_code[first[free]]
    flow_code[:] = op_code[owner]


def flow_keys(op: np.ndarray, flow: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """One uint64 per flow: (rank, comm, seq, channel, peer, dir)."""
    base = pair_keys(op["rank"], op["comm"]) ^ (op["seq"].astype(np.uint64) * _MIX)
    k = base[owner] * _MIX
    k ^= flow["channel"].astype(np.int64).astype(np.uint64) << np.uint64(40)
    k ^= flow["peer"].astype(np.int64).astype(np.uint64) << np.uint64(8)
    return np.asarray(k ^ flow["dir"].astype(np.uint64))
