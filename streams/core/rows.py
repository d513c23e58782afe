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
