"""Column layouts of the batched, columnar record types.

State and completion records are batched per host per tick. Inside a batch
each row group (``rc``, ``op``, ``flow``) is stored column by column: one Avro
``bytes`` field per column holding a packed little-endian array, and one
``n_<group>`` int giving the row count. Decoding is ``np.frombuffer`` per
column, so cost does not grow with a Python object per row.

The tables below are the single source of truth for names, dtypes and units;
``tests/unit/test_schemas.py`` checks that every ``.avsc`` file agrees.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Column:
    """One packed column: Avro field ``<group>_<name>`` of numpy ``dtype``."""

    name: str
    dtype: str
    doc: str
    optional: bool = False  # added later: an empty column is absent (zeros)


Group = tuple[Column, ...]

RC_COLUMNS: Group = (
    Column("rank", "<i4", "global rank"),
    Column("comm", "<u8", "communicator hash (NCCL commHash)"),
    Column(
        "issued_seq", "<i8", "op_seq of the last op the rank issued on comm; -1: none"
    ),
    Column(
        "done_seq", "<i8", "op_seq of the last op the rank completed on comm; -1: none"
    ),
    Column(
        "seen_ns", "<i8", "last time the rank's process wrote anything, ns since epoch"
    ),
)
"""One row per rank x communicator per tick: the rank-state record."""

OP_COLUMNS: Group = (
    Column("rank", "<i4", "global rank running the op"),
    Column("comm", "<u8", "communicator hash"),
    Column("seq", "<i8", "op sequence number within the communicator, from 0"),
    Column("kind", "<u1", "code into vocab.OP_NAMES"),
    Column("algo", "<u1", "code into vocab.ALGORITHMS"),
    Column("proto", "<u1", "code into vocab.PROTOCOLS"),
    Column("bytes", "<i8", "message size in bytes (per rank input)"),
    Column("issue_ns", "<i8", "time the op was enqueued by the framework, ns"),
    Column(
        "start_ns",
        "<i8",
        "time of the op's first progress on any flow, ns; 0: not started",
    ),
    Column("nflows", "<i4", "number of flow rows of this op; flows follow in op order"),
)
"""One row per in-flight op per tick (op finished: see the completion record)."""

FLOW_COLUMNS: Group = (
    Column("channel", "<i2", "NCCL channel id"),
    Column("peer", "<i4", "global rank at the other end"),
    Column("dir", "<u1", "code into vocab.DIRECTIONS, seen from the reporting rank"),
    Column("total", "<i4", "chunks this flow moves for the op"),
    Column(
        "gpu_ready",
        "<i4",
        "chunks the GPU has made ready (copied to the buffer), cumulative",
    ),
    Column(
        "transmitted", "<i4", "chunks posted to the network by the proxy, cumulative"
    ),
    Column("done", "<i4", "chunks whose completion was polled, cumulative"),
    Column(
        "last_ns", "<i8", "time any counter of this flow last changed, ns; 0: never"
    ),
    Column(
        "ready_wait_us",
        "<i4",
        "send flow: microseconds its steps spent with their data ready before "
        "the transport took them (SendPeerWait to SendWait), summed, the head "
        "step's current wait included, cumulative; 0: not measured or a recv flow",
        optional=True,
    ),
)
"""One row per flow (channel x peer x direction) of each in-flight op.

Invariant: ``total >= gpu_ready >= transmitted >= done >= 0``.
"""

DONE_OP_COLUMNS: Group = (
    Column("rank", "<i4", "global rank"),
    Column("comm", "<u8", "communicator hash"),
    Column("seq", "<i8", "op sequence number within the communicator"),
    Column("kind", "<u1", "code into vocab.OP_NAMES"),
    Column("bytes", "<i8", "message size in bytes"),
    Column("issue_ns", "<i8", "enqueue time, ns"),
    Column("start_ns", "<i8", "first progress, ns"),
    Column("end_ns", "<i8", "completion, ns"),
    Column("nflows", "<i4", "number of flow rows of this op"),
)
"""One row per op completed during the tick."""

DONE_FLOW_COLUMNS: Group = (
    Column("channel", "<i2", "NCCL channel id"),
    Column("peer", "<i4", "global rank at the other end"),
    Column("dir", "<u1", "code into vocab.DIRECTIONS"),
    Column("chunks", "<i4", "chunks moved"),
    Column("first_ns", "<i8", "first progress of this flow, ns"),
    Column("last_ns", "<i8", "last completion of this flow, ns"),
    Column(
        "wire_ns",
        "<i8",
        "time this flow's data spent on the network, from posted to done, "
        "summed over its steps, ns; 0: not measured",
        optional=True,
    ),
)
"""One row per flow of each completed op; duration is ``last_ns - first_ns``."""

STATE_GROUPS: dict[str, Group] = {
    "rc": RC_COLUMNS,
    "op": OP_COLUMNS,
    "flow": FLOW_COLUMNS,
}
COMPLETION_GROUPS: dict[str, Group] = {"op": DONE_OP_COLUMNS, "flow": DONE_FLOW_COLUMNS}


@lru_cache(maxsize=64)
def dtype_of(group: Group) -> np.dtype[np.void]:
    """Return the structured numpy dtype of a row group (cached: every
    decoded batch asks for its groups' dtypes)."""
    return np.dtype([(c.name, c.dtype) for c in group])


def empty(group: Group, n: int = 0) -> np.ndarray:
    """Return a zeroed structured array of ``n`` rows of ``group``."""
    return np.zeros(n, dtype=dtype_of(group))
