"""Fixed vocabularies shared by the schemas, the producers and the core.

Columnar fields carry these as small integer codes: the code of a name is its
index in the tuple. Tuples are append-only; a code never changes meaning
within a topic version (see ``schemas/README.md``, "Evolution").
"""

from __future__ import annotations

from enum import StrEnum

OP_NAMES: tuple[str, ...] = (
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
    "send",
    "recv",
    "alltoall",
    "barrier",
    "gather",
    "scatter",
    "split",
    "window",
    "coalesced",
)
"""Collective or point-to-point operation names (``op_kind`` codes).

``split`` (a communicator split), ``window`` (a window registration) and
``coalesced`` (a coalesced group whose member ops were not recorded one by
one) are group-wide calls PyTorch's Flight Recorder records beside the data
collectives."""

ALGORITHMS: tuple[str, ...] = (
    "unknown",
    "ring",
    "tree",
    "p2p",
    "nvls",
    "collnet_direct",
    "collnet_chain",
    "pat",
    "nvls_tree",
)
"""NCCL algorithm names (``op_algo`` codes; append-only)."""

PROTOCOLS: tuple[str, ...] = ("unknown", "simple", "ll", "ll128")
"""NCCL protocol names (``op_proto`` codes)."""

DIRECTIONS: tuple[str, ...] = ("send", "recv")
"""Flow direction seen from the reporting rank (``flow_dir`` codes)."""

TRANSPORTS: tuple[str, ...] = ("unknown", "net", "p2p", "shm", "collnet", "nvls")
"""Transport of a connection in the topology record."""


class Component(StrEnum):
    """Where a root cause sits. The vocabulary is fixed; see the schema docs."""

    GPU = "gpu"
    NIC = "nic"
    NETWORK = "network"
    PCIE = "pcie"
    PROXY = "proxy"
    PROCESS = "process"
    HOST = "host"
    CONFIG = "config"


class FaultKind(StrEnum):
    """What the job experiences."""

    HANG = "hang"
    SLOWDOWN = "slowdown"
    MISMATCH = "mismatch"


class IncidentState(StrEnum):
    """Where an incident stands on one of its root-cause revisions."""

    OPEN = "open"
    CLOSED = "closed"  # its last revision: nothing fired for incident_quiet_s


SEND = DIRECTIONS.index("send")
RECV = DIRECTIONS.index("recv")


def code_of(vocab: tuple[str, ...], name: str) -> int:
    """Return the integer code of ``name`` in ``vocab``.

    Raises:
        ValueError: ``name`` is not in the vocabulary; the message lists it.
    """
    try:
        return vocab.index(name)
    except ValueError:
        raise ValueError(f"{name!r} is not one of {', '.join(vocab)}") from None
