"""Which op sizes must agree across the members of one ``(comm, seq)``.

The ``bytes`` an op row carries is the reporting rank's own input size
(``columns.py``). For most collectives every member passes a buffer of one
size, and a member that differs is a real mismatch (a wrong shape, a skipped
layer). For some ops the sizes differ by design: an all-to-all's per-peer
splits follow the data (MoE routing sends each expert what its tokens chose),
so each member's input size is its own. This table is the single place that
says which is which; ``schemas/README.md`` ("What producers write") explains
each entry.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from mycroft.schemas.vocab import OP_NAMES


class SizeRule(StrEnum):
    """How the members' ``bytes`` of one op relate."""

    EQUAL = "equal"
    """Every member reports the same size; a different one is a mismatch."""
    PAIR = "pair"
    """Point-to-point: the sender's size equals its receiver's."""
    PER_RANK = "per-rank"
    """Each member reports its own input size; sizes may differ freely."""


SIZE_RULES: dict[str, SizeRule] = {
    "allreduce": SizeRule.EQUAL,
    "allgather": SizeRule.EQUAL,
    "reducescatter": SizeRule.EQUAL,
    "broadcast": SizeRule.EQUAL,
    "reduce": SizeRule.EQUAL,
    "send": SizeRule.PAIR,
    "recv": SizeRule.PAIR,
    # all_to_all_single with input/output split sizes, or all_to_all with a
    # tensor list: what a rank sends to each peer is its own choice.
    "alltoall": SizeRule.PER_RANK,
    # NCCL runs a barrier as a one-element all-reduce on every member.
    "barrier": SizeRule.EQUAL,
    "gather": SizeRule.EQUAL,
    "scatter": SizeRule.EQUAL,
    # A communicator split moves no data: every member reports 0 bytes.
    "split": SizeRule.EQUAL,
    # A window registration: each rank registers its own buffer.
    "window": SizeRule.PER_RANK,
    # A coalesced group recorded as one op: its size is the sum of the
    # member ops a rank put in it, which differs by design for the ``_v``
    # and all-to-all members FSDP coalesces.
    "coalesced": SizeRule.PER_RANK,
}
"""Size rule of every name in ``vocab.OP_NAMES`` (a test keeps them in step)."""

_PER_RANK = np.array(
    [SIZE_RULES[name] is SizeRule.PER_RANK for name in OP_NAMES] + [False]
)


def sizes_may_differ(kind: np.ndarray) -> np.ndarray:
    """Return a boolean mask: True where op kind code ``kind`` is ``PER_RANK``.

    Codes outside ``OP_NAMES`` (a newer producer's op) count as ``EQUAL``:
    a size disagreement there is still reported.
    """
    code = np.minimum(kind.astype(np.int64), len(OP_NAMES))
    out: np.ndarray = _PER_RANK[code]
    return out
