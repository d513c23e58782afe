"""Helpers for numpy structured rows shared by the core's modules."""

from __future__ import annotations

import numpy as np


def stack_rows(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate same-dtype structured rows (``np.concatenate`` promotes
    structured dtypes field by field first: most of its cost on small parts)."""
    if len(parts) == 1:
        return parts[0]
    out = np.empty(sum(len(p) for p in parts), dtype=parts[0].dtype)
    at = 0
    for p in parts:
        out[at : at + len(p)] = p
        at += len(p)
    return out


def run_starts(*cols: np.ndarray) -> np.ndarray:
    """Return a mask of the rows of sorted ``cols`` where a run of equal keys
    starts: the first row, and every row where any column changes."""
    out = np.zeros(len(cols[0]), bool)
    if len(out):
        out[0] = True
        for c in cols:
            out[1:] |= c[1:] != c[:-1]
    return out


def group_ids(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group the rows of ``cols`` by their values: each row's group number
    (groups in ascending key order, the first column first) and each group's
    first row (its lowest index)."""
    order = np.lexsort(cols[::-1])
    new = run_starts(*(c[order] for c in cols))
    group = np.empty(len(order), np.int64)
    group[order] = np.cumsum(new) - 1
    return group, order[new]  # lexsort is stable: the lowest index first


def group_medians(
    keys: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return the distinct ``keys`` (ascending) and ``np.median`` of the
    ``values`` of each, all groups in one sort."""
    k, _, med = group_counts_medians(keys, values)
    return k, med


def group_counts_medians(
    keys: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``group_medians`` with each group's row count (keys, counts, medians)."""
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order].astype(np.float64)
    starts = np.flatnonzero(run_starts(k))
    n = np.diff(np.r_[starts, len(k)])
    out: np.ndarray = (v[starts + (n - 1) // 2] + v[starts + n // 2]) / 2
    return k[starts], n, out
