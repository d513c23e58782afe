"""PyTorch Flight Recorder op names and their Mycroft op kinds.

Every name in torch 2.13's ``flight_recorder.components.types.COLLECTIVES``
and ``P2P`` maps to a code of ``schemas.vocab.OP_NAMES``, plus the names
older dumps and the gloo backend write. A name outside this table is
unknown: the reader keeps the entry and counts the name, it never drops it.
"""

from __future__ import annotations

from mycroft.schemas.vocab import OP_NAMES

_KINDS: dict[str, tuple[str, ...]] = {
    "allreduce": (
        "all_reduce",
        "allreduce",
        "all_reduce_coalesced",
        "allreduce_coalesced",
    ),
    "allgather": (
        "all_gather",
        "allgather",
        "all_gather_single",
        "all_gather_v",
        "_all_gather_base",
        "_allgather_base",
        "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced",
        "allgather_coalesced",
        "ALLGATHER_coalesced",
    ),
    "reducescatter": (
        "reduce_scatter",
        "reduce_scatter_single",
        "reduce_scatter_v",
        "_reduce_scatter_base",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
        "REDUCE_SCATTER_coalesced",
    ),
    "broadcast": ("broadcast", "_broadcast_oop"),
    "reduce": ("reduce", "_reduce_oop"),
    "alltoall": (
        "all_to_all",
        "alltoall",
        "alltoall_base",
        "all_to_all_single",
        "all_to_all_v_single",
    ),
    "barrier": ("barrier", "all_reduce_barrier"),
    "gather": ("gather",),
    "scatter": ("scatter",),
    "send": ("send",),
    "recv": ("recv",),
    "split": ("split",),
    "window": ("new_window",),
    "coalesced": ("coalesced",),
}

TORCH_OPS: dict[str, int] = {
    name: OP_NAMES.index(kind) for kind, names in _KINDS.items() for name in names
}
"""Flight Recorder op name -> ``OP_NAMES`` code."""

UNKNOWN_KIND = 255
"""``FrEntry.kind`` of a name outside ``TORCH_OPS`` (outside ``OP_NAMES``)."""

_ALL_TO_ALL = {"all_to_all", "alltoall", "alltoall_base"}
_ALL_TO_ALL |= {"all_to_all_single", "all_to_all_v_single"}
OUT_OF_PLACE_EXEMPT: dict[str, frozenset[str]] = {
    "input": frozenset({*_ALL_TO_ALL, "scatter", "all_gather_v", "coalesced"}),
    "output": frozenset({*_ALL_TO_ALL, "gather", "reduce_scatter_v", "coalesced"}),
}
"""Ops whose input or output sizes legitimately differ across ranks (a
scatter's inputs live on the root only, a gather's outputs likewise, an
all-to-all's splits are per rank, a ``_v`` op's per-rank part has its own
size)."""


def op_name(profiling_name: object) -> str:
    """``"nccl:send 0->1"`` -> ``"send"``: the op name without backend or peers."""
    return str(profiling_name or "").rpartition(":")[2].partition(" ")[0]


def op_kind(name: str) -> int:
    """The ``OP_NAMES`` code of ``name``; ``UNKNOWN_KIND`` when it has none."""
    return TORCH_OPS.get(name, UNKNOWN_KIND)
