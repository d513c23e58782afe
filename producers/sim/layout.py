"""Rank mapping, communicators and the rank x communicator slot table.

Megatron order, TP innermost, then DP, then PP (``SimConfig.order``
``tp-dp-pp``; ``tp-pp-dp`` swaps DP and PP, ``rank = t + tp * (p + pp * d)``)::

    rank = t + tp * (d + dp * p)        host = rank // gpus_per_host

``grid[p, d, t]`` holds the global rank. Communicators: one per TP group
``(p, d)``, one per DP group ``(p, t)``, and one per adjacent pipeline pair
``(p, p+1)`` of each ``(d, t)`` (the pair carries forward activations and
backward gradients; interleaved 1F1B adds the pair ``(pp-1, 0)``).
Communicators of one rank never share a slot; the slot
table lists every rank x communicator pair sorted by host, rank, comm.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from mycroft.producers.sim.config import SimConfig

TP, DP, PP_NEXT, PP_PREV = range(4)
"""Slot roles of a rank: its TP comm, DP comm, pipeline pair to the next and
previous stage."""


def comm_hash(job_id: str, seed: int, role: str, index: int) -> int:
    """A deterministic 64-bit communicator hash (stands in for NCCL's commHash)."""
    text = f"{job_id}:{seed}:{role}:{index}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class CommGroup:
    """Communicators of one role: ``ranks[g]`` in comm-rank (ring) order."""

    role: str
    ranks: np.ndarray
    comm: np.ndarray


@dataclass(frozen=True)
class Layout:
    """Everything derived from the job shape, as arrays over ranks and groups."""

    grid: np.ndarray
    host_of: np.ndarray
    local_of: np.ndarray
    nic_of: np.ndarray
    tp: CommGroup
    dp: CommGroup
    pp: tuple[CommGroup, ...]
    slot_rank: np.ndarray
    slot_comm: np.ndarray
    slot_of: np.ndarray
    host_slots: np.ndarray
    nhosts: int

    @property
    def nranks(self) -> int:
        """World size."""
        return int(self.grid.size)

    def host_ranks(self, host: int) -> np.ndarray:
        """Global ranks on ``host``."""
        return np.flatnonzero(self.host_of == host)

    def groups(self) -> list[CommGroup]:
        """Every communicator role with more than one rank."""
        out = [g for g in (self.tp, self.dp) if g.ranks.shape[1] > 1]
        return out + list(self.pp)


def _group(cfg: SimConfig, role: str, ranks: np.ndarray, base: int = 0) -> CommGroup:
    hashes = [
        comm_hash(cfg.job_id, cfg.seed, role, base + i) for i in range(len(ranks))
    ]
    return CommGroup(role, ranks, np.array(hashes, dtype=np.uint64))


def _slots(n: int, groups: list[tuple[int, CommGroup]]) -> tuple[np.ndarray, ...]:
    ranks: list[np.ndarray] = []
    comms: list[np.ndarray] = []
    roles: list[np.ndarray] = []
    for role, g in groups:
        r = g.ranks
        if role == PP_NEXT:
            r = r[:, :1]
        elif role == PP_PREV:
            r = r[:, 1:]
        elif r.shape[1] < 2:
            continue
        ranks.append(r.ravel())
        comms.append(np.repeat(g.comm, r.shape[1]))
        roles.append(np.full(r.size, role))
    rank = np.concatenate(ranks) if ranks else np.zeros(0, np.int64)
    comm = np.concatenate(comms) if comms else np.zeros(0, np.uint64)
    role_arr = np.concatenate(roles) if roles else np.zeros(0, np.int64)
    order = np.lexsort((comm, rank))
    rank, comm, role_arr = rank[order], comm[order], role_arr[order]
    slot_of = np.full((n, 4), -1, dtype=np.int64)
    slot_of[rank, role_arr] = np.arange(len(rank))
    return rank.astype(np.int32), comm, slot_of


def build_layout(cfg: SimConfig) -> Layout:
    """Derive the rank grid, communicators and slot table of ``cfg``."""
    hw = cfg.hardware
    n = cfg.ranks
    grid = np.arange(n).reshape(cfg.pp, cfg.dp, cfg.tp)
    if cfg.order == "tp-pp-dp":
        grid = np.arange(n).reshape(cfg.dp, cfg.pp, cfg.tp).transpose(1, 0, 2)
    ranks = np.arange(n)
    tp = _group(cfg, "tp", grid.reshape(-1, cfg.tp))
    dp = _group(cfg, "dp", grid.transpose(0, 2, 1).reshape(-1, cfg.dp))
    pp = tuple(
        _group(
            cfg,
            "pp",
            np.stack([grid[p].ravel(), grid[p + 1].ravel()], axis=1),
            p * cfg.dp * cfg.tp,
        )
        for p in range(cfg.pp - 1)
    )
    if cfg.workload.virtual_stages > 1:
        # Interleaved 1F1B: the last stage's chunk feeds the first stage's
        # next chunk, so the pipeline closes into a ring (pair pp-1 -> 0).
        wrap = np.stack([grid[-1].ravel(), grid[0].ravel()], axis=1)
        pp += (_group(cfg, "pp", wrap, (cfg.pp - 1) * cfg.dp * cfg.tp),)
    roles = [(TP, tp), (DP, dp)]
    roles += [(PP_NEXT, g) for g in pp] + [(PP_PREV, g) for g in pp]
    slot_rank, slot_comm, slot_of = _slots(n, roles)
    host_of = ranks // hw.gpus_per_host
    nhosts = cfg.hosts
    host_slots = np.searchsorted(slot_rank // hw.gpus_per_host, np.arange(nhosts + 1))
    local = ranks % hw.gpus_per_host
    return Layout(
        grid=grid,
        host_of=host_of,
        local_of=local,
        nic_of=host_of * (hw.gpus_per_host // hw.gpus_per_nic)
        + local // hw.gpus_per_nic,
        tp=tp,
        dp=dp,
        pp=pp,
        slot_rank=slot_rank,
        slot_comm=slot_comm,
        slot_of=slot_of,
        host_slots=host_slots,
        nhosts=nhosts,
    )


def host_name(host: int) -> str:
    """Host name of host index ``host``."""
    return f"node{host:04d}"


def nic_name(local_nic: int) -> str:
    """Device name of a host's NIC ``local_nic`` (as Topology and the port
    state in heartbeats spell it)."""
    return f"mlx5_{local_nic}"


def host_ip(host: int) -> str:
    """IP address of host index ``host``."""
    return f"10.{host >> 16 & 255}.{host >> 8 & 255}.{host & 255}"
