"""Stage 0 of the two-stage worker: re-batch a host's rows by communicator group.

A host's state and completion batches cover every communicator its ranks are
in. ``split_by_comm`` cuts them into one batch per *comm group*
(``comm_group(comm, groups)``, a stable hash of the communicator modulo the
group count), so that one stage-1 worker folds only the communicators of its
groups. Headers are kept as they are: the batch dedup key
``(type, host, epoch, seq)`` stays valid per group, so a split batch produced
twice is still ignored downstream. See ``streams/SCALING.md``.
"""

from __future__ import annotations

import numpy as np

from mycroft.schemas.records import CompletionBatch, StateBatch

_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads any 64-bit id


def comm_group(comm: np.ndarray | int, groups: int) -> np.ndarray:
    """Group of each communicator hash: ``(comm * phi64 >> 32) % groups``.

    Stable across processes and releases (no Python ``hash``); vectorised.
    """
    if groups < 1:
        raise ValueError(f"comm groups must be >= 1, got {groups}")
    c = np.asarray(comm, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = (c * _MIX) >> np.uint64(32)
    out: np.ndarray = (mixed % np.uint64(groups)).astype(np.int64)
    return out


def _flow_owner(nflows: np.ndarray, n_flow_rows: int) -> np.ndarray | None:
    """Index of the op that owns each flow row; None when the counts disagree."""
    counts = np.maximum(nflows.astype(np.int64), 0)
    if int(counts.sum()) != n_flow_rows:
        return None
    return np.repeat(np.arange(len(counts)), counts)


def split_by_comm(
    batch: StateBatch | CompletionBatch, groups: int
) -> dict[int, StateBatch | CompletionBatch]:
    """Cut one host batch into per-group batches with the same header.

    Every group in ``range(groups)`` gets a batch, empty when the host has no
    rows there: a state batch is also the host's sign of life, which every
    group's silence detector needs. Flow rows follow their op. A batch whose
    ``op.nflows`` do not add up to its flow rows keeps its ops and loses its
    flows (the core does the same with such a batch).
    """
    op_group = comm_group(batch.op["comm"], groups)
    owner = _flow_owner(batch.op["nflows"], len(batch.flow))
    if owner is None:
        flow, op = batch.flow[:0], batch.op.copy()
        op["nflows"] = 0
        flow_group = np.zeros(0, dtype=np.int64)
    else:
        flow, op = batch.flow, batch.op
        flow_group = op_group[owner]
    out: dict[int, StateBatch | CompletionBatch] = {}
    if isinstance(batch, StateBatch):
        rc_group = comm_group(batch.rc["comm"], groups)
        for g in range(groups):
            out[g] = StateBatch(
                batch.header,
                rc=batch.rc[rc_group == g],
                op=op[op_group == g],
                flow=flow[flow_group == g],
            )
        return out
    for g in range(groups):
        out[g] = CompletionBatch(
            batch.header, op=op[op_group == g], flow=flow[flow_group == g]
        )
    return out


def nonempty_groups(parts: dict[int, StateBatch | CompletionBatch]) -> list[int]:
    """Groups of a completion split that hold rows (empty ones need no message)."""
    return [g for g, b in parts.items() if len(b.op)]


__all__ = ["comm_group", "nonempty_groups", "split_by_comm"]
