"""Step timing of ring collectives and p2p transfers, vectorised over groups.

Per ring step ``k`` and rank ``i`` (sending to ``i+1``, receiving from ``i-1``)::

    avail  = launch                         (k = 0)
           = arrival of step k-1 from i-1   (k > 0: the ring dependency)
    G: [gb, ge]  gb = max(avail, ge[k-1]);  ge = gb + copy time
    T: [tb, te]  tb = max(gb + proxy, te[k-1], launch of i+1 at k = 0)
                 te = max(ge + proxy, tb + wire time), stretched over outages
    D: [db, de]  db = max(tb + lat, de[k-1]);  de = max(te + lat, db)

and the arrival at ``i+1`` is ``de``. That is the default ``fluid`` model;
``Hardware(counters="slots")`` uses slot semantics instead (``_slot_steps``),
and ``counters="nccl"`` the same timing, reported as NCCL's profiler sees it
(``OpBlock.nccl``).
The receiving side of ``i`` reports
gpu_ready = buffers posted (sender's T), transmitted = data arrived (sender's
D) and done = consumed by its own kernel (its next step's G). A dead GPU or
process turns every later time into ``inf``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.effects import Effects
from mycroft.producers.sim.layout import Layout
from mycroft.producers.sim.opblock import OpBlock
from mycroft.schemas.vocab import ALGORITHMS, OP_NAMES, PROTOCOLS, RECV, SEND

SIMPLE = PROTOCOLS.index("simple")
RING = ALGORITHMS.index("ring")
P2P = ALGORITHMS.index("p2p")


@dataclass(frozen=True)
class OpRequest:
    """One op of every communicator of a role.

    ``ranks[g]`` are the members in ring order (p2p: ``[sender, receiver]``),
    ``issue`` their enqueue times (CPU), ``gpu_free`` when their GPU stream
    reaches the op, ``seq`` the op number per communicator. ``row_bytes``
    (same shape as ``ranks``), when given, is each member's own input size
    for an op whose sizes differ per rank (an all-to-all); ``nbytes`` is then
    unused.
    """

    kind: str
    ranks: np.ndarray
    comm: np.ndarray
    seq: np.ndarray
    issue: np.ndarray
    nbytes: int
    channels: int
    gpu_free: np.ndarray
    row_bytes: np.ndarray | None = None


class Physics:
    """Turn op requests into :class:`OpBlock` timelines."""

    def __init__(
        self, cfg: SimConfig, layout: Layout, effects: Effects, rng: np.random.Generator
    ) -> None:
        self.cfg = cfg
        self.hw = cfg.hardware
        self.layout = layout
        self.fx = effects
        self.rng = rng

    def _jitter(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.exp(self.hw.jitter * self.rng.standard_normal(shape))

    def _link(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        t: np.ndarray,
        step_bytes: np.ndarray,
        channels: int,
    ) -> tuple[np.ndarray, ...]:
        """Per step: copy time, wire time, healthy wire time, latency, network
        mask and the buffer lead (fraction of a step the GPU may run ahead)."""
        hw, host = self.hw, self.layout.host_of
        net = host[src] != host[dst]
        copy_gbps = np.where(net, min(hw.gpu_copy_gbps, hw.pcie_gbps), hw.gpu_copy_gbps)
        copy_s = step_bytes / (copy_gbps * 1e9) * self.fx.copy_mult(src, t, net)
        base = np.where(net, hw.nic_gbps / hw.gpus_per_nic, hw.nvlink_gbps) * 1e9
        wire_h = step_bytes / base
        wire_s = wire_h / np.where(net, self.fx.rate_frac(src, dst, t), 1.0)
        # The NIC writes into the receiving GPU over PCIe: a slow PCIe slows arrival.
        pcie_s = step_bytes / (hw.pcie_gbps * 1e9 * self.fx.pcie_frac(dst, t))
        wire_s = np.where(net, np.maximum(wire_s, pcie_s), wire_s)
        lat = np.where(
            net, hw.net_latency_s + self.fx.lag_s(src, dst, t), hw.nvlink_latency_s
        )
        cps = _cps(step_bytes.astype(np.int64), channels, hw.chunk_bytes)
        lead = np.minimum(1.0, hw.buffer_chunks / cps)
        return copy_s, wire_s, wire_h, lat, net, lead

    def _launch(
        self, ranks: np.ndarray, issue: np.ndarray, gpu_free: np.ndarray
    ) -> np.ndarray:
        start = issue + self.hw.launch_latency_s * self._jitter(issue.shape)
        start = np.maximum(start, gpu_free)
        return np.where(start > self.fx.gpu_dead[ranks], np.inf, start)

    def ring(self, req: OpRequest, culprit: np.ndarray | None = None) -> OpBlock:
        """Ring allreduce (2(n-1) steps), reducescatter, allgather or
        alltoall (n-1; each rank's steps carry ``row_bytes / n`` of its own)."""
        ranks, n = req.ranks, req.ranks.shape[1]
        steps = 2 * (n - 1) if req.kind == "allreduce" else n - 1
        nbytes = np.full(ranks.shape, req.nbytes, dtype=np.int64)
        if req.row_bytes is not None:
            nbytes = req.row_bytes.astype(np.int64)
        dst = np.roll(ranks, -1, axis=1)
        link = self._link(ranks, dst, req.issue, nbytes // n, req.channels)
        start = self._launch(ranks, req.issue, req.gpu_free)
        send, posted, held = self._ring_steps(
            ranks, dst, (start, np.roll(start, -1, axis=1)), link, steps
        )
        recv = _ring_recv(send, link[0], self.fx.gpu_dead[ranks])
        held_recv = _ring_recv(held, link[0], self.fx.gpu_dead[ranks])
        held_recv[..., 2, :, -1] = np.nan  # the last step's use: a copy
        posts = np.stack(
            [
                send[..., 0, :, :],
                np.repeat(np.roll(posted, 1, axis=1)[..., None, :], 2, -2),
            ],
            axis=2,
        )
        times = np.stack([send, recv], axis=2)
        holds = np.stack([held, held_recv], axis=2)
        if culprit is not None and culprit.any():
            nbytes = np.where(culprit, nbytes * 2, nbytes)
            times[culprit.any(axis=1), :, :, :, :, steps // 2 :] = np.inf
        cps = _cps(nbytes // n, req.channels, self.hw.chunk_bytes)
        return self._block(req, times, nbytes, cps, RING, posts=posts, holds=holds)

    def _ring_steps(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        launch: tuple[np.ndarray, np.ndarray],
        link: tuple[np.ndarray, ...],
        steps: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Send-side intervals ``(G, n, 3, 2, steps)``, the time the receiver
        posted the buffer of each step ``(G, n, steps)`` and the outages
        inside the intervals (``OpBlock.holds``).

        ``launch`` holds each rank's kernel start and its receiver's. The
        fluid model has no credits: the receiver posts every buffer when its
        kernel starts.
        """
        if self.hw.counters in ("slots", "nccl"):
            return self._slot_steps(src, dst, launch, link, steps)
        start, peer_start = launch
        copy_s, wire_s, wire_h, lat, net, lead = link
        hw, fx = self.hw, self.fx
        gdead, pdead_src, pdead_dst = (
            fx.gpu_dead[src],
            fx.proc_dead[src],
            fx.proc_dead[dst],
        )
        out = np.empty((*src.shape, 3, 2, steps))
        holds = np.empty_like(out)
        jit = self._jitter((2, steps, *src.shape))
        ge, te, de = start, np.full(src.shape, -np.inf), np.full(src.shape, -np.inf)
        for k in range(steps):
            avail = start if k == 0 else np.roll(de, 1, axis=1)
            gb = np.maximum(avail, ge)
            ge = gb + copy_s * jit[0, k]
            tb = np.maximum(gb + hw.proxy_latency_s, te)
            if k == 0:
                tb = np.maximum(tb, peer_start + hw.proxy_latency_s)
            te = np.maximum(ge + hw.proxy_latency_s, tb + wire_s * jit[1, k])
            tb0 = tb
            tb, te, hb, he = fx.pause(tb, te, src, dst, net)
            # The GPU fills buffer slots as fast as a healthy link drains them,
            # at most `lead` of a step ahead of the transmit, and starts a step
            # once the previous one left the buffer (outages not counted).
            with np.errstate(invalid="ignore"):
                slack = np.where(np.isfinite(te), lead * (te - tb), np.inf)
                paced = np.fmax(tb0 + wire_h * jit[1, k], te - slack)
                ge = np.fmax(ge, np.minimum(paced, te - hw.proxy_latency_s))
            gb = np.maximum(gb, np.minimum(ge, tb0 - hw.proxy_latency_s))
            ge = np.where(ge > gdead, np.inf, ge)
            te = np.where(te > pdead_src, np.inf, te)
            db = np.maximum(tb + lat, de)
            de = np.maximum(te + lat, db)
            de = np.where(de > pdead_dst, np.inf, de)
            _put(out, k, (gb, ge), (tb, te), (db, de))
            _put(holds, k, _NONE, (hb, he), (hb + lat, he + lat))
        return out, np.repeat(peer_start[..., None], steps, -1), holds

    def _slot_steps(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        launch: tuple[np.ndarray, np.ndarray],
        link: tuple[np.ndarray, ...],
        steps: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Send-side intervals under slot (credit) semantics, the grants and
        the outages inside the intervals.

        A step is staged (G), posted (T) once it is staged and the receiver
        granted its slot: the receiver launched (step 0) or started its step
        ``k - 1``, so consumed step ``k - 2`` (two steps of slots per
        channel); and
        completed (D) after the wire, which carries one step at a time. A
        late receiver leaves ``G > T``; a slow wire leaves ``T > D``. The
        grant of a step is when the receiver posted its buffer (its recv
        flow's G).
        """
        start, peer_start = launch
        copy_s, wire_s, _, lat, net, _ = link
        hw, fx = self.hw, self.fx
        gdead = fx.gpu_dead[src]
        pdead_src, pdead_dst = fx.proc_dead[src], fx.proc_dead[dst]
        out = np.empty((*src.shape, 3, 2, steps))
        holds = np.empty_like(out)
        jit = self._jitter((2, steps, *src.shape))
        ge, te, de = start, np.full(src.shape, -np.inf), np.full(src.shape, -np.inf)
        we = np.full(src.shape, -np.inf)
        gb_prev = start
        posted = np.empty((*src.shape, steps))
        for k in range(steps):
            avail = start if k == 0 else np.roll(de, 1, axis=1)
            gb = np.maximum(avail, ge)
            ge = gb + copy_s * jit[0, k]
            ge = np.where(ge > gdead, np.inf, ge)
            grant = peer_start if k == 0 else np.roll(gb_prev, -1, axis=1)
            posted[..., k] = grant
            tb = np.maximum(np.maximum(gb, grant) + hw.proxy_latency_s, te)
            te = np.maximum(ge, tb) + hw.proxy_latency_s
            # A stalled proxy posts nothing; a NIC outage stops the wire.
            tb, te, hb, he = fx.pause(tb, te, src, dst, net, proxy=True)
            wb = np.maximum(tb, we)
            we = np.maximum(te, wb + wire_s * jit[1, k])
            wb, we, wh, wl = fx.pause(wb, we, src, dst, net, proxy=False)
            te = np.where(te > pdead_src, np.inf, te)
            we = np.where(we > pdead_src, np.inf, we)
            db = np.maximum(wb + lat, de)
            de = np.maximum(we + lat, db)
            de = np.where(de > pdead_dst, np.inf, de)
            gb_prev = gb
            _put(out, k, (gb, ge), (tb, te), (db, de))
            _put(holds, k, _NONE, (hb, he), (wh + lat, wl + lat))
        return out, posted, holds

    def p2p(self, req: OpRequest) -> OpBlock:
        """Point-to-point send (column 0) to recv (column 1), one step."""
        src, dst = req.ranks[:, 0], req.ranks[:, 1]
        nbytes = np.full(req.ranks.shape, req.nbytes, dtype=np.int64)
        link = self._link(src, dst, req.issue[:, 0], nbytes[:, 0], req.channels)
        copy_s = link[0]
        start_s = self._launch(src, req.issue[:, 0], req.gpu_free[:, 0])
        start_r = self._launch(dst, req.issue[:, 1], req.gpu_free[:, 1])
        link = tuple(x[:, None] for x in link)
        launch = (start_s[:, None], start_r[:, None])
        send, posted, held = self._ring_steps(
            src[:, None], dst[:, None], launch, link, 1
        )
        send, held = send[:, 0], held[:, 0]
        recv = send.copy()
        recv[:, 0], recv[:, 1] = send[:, 1], send[:, 2]
        held_recv = np.full_like(held, np.nan)
        held_recv[:, 0], held_recv[:, 1] = held[:, 1], held[:, 2]
        arrived = send[:, 2, 1, 0]
        consumed = arrived + copy_s * self._jitter(arrived.shape)
        recv[:, 2, 0, 0] = arrived
        recv[:, 2, 1, 0] = np.where(consumed > self.fx.gpu_dead[dst], np.inf, consumed)
        times = np.zeros((len(src), 2, 2, 3, 2, 1))
        times[:, 0, SEND], times[:, 1, RECV] = send, recv
        times[:, 0, RECV], times[:, 1, SEND] = send, recv
        holds = np.full_like(times, np.nan)
        holds[:, 0, SEND], holds[:, 1, RECV] = held, held_recv
        holds[:, 0, RECV], holds[:, 1, SEND] = held, held_recv
        posts = times[..., 0, :, :].copy()
        posts[:, 1, RECV] = np.repeat(posted[:, 0, None, :], 2, -2)
        cps = _cps(nbytes, req.channels, self.hw.chunk_bytes)
        return self._block(req, times, nbytes, cps, P2P, posts=posts, holds=holds)

    def _block(
        self,
        req: OpRequest,
        times: np.ndarray,
        nbytes: np.ndarray,
        cps: np.ndarray,
        algo: int,
        *,
        posts: np.ndarray,
        holds: np.ndarray,
    ) -> OpBlock:
        """The op's rows; ``posts`` holds each profile's G as reported (a
        receive flow's: the buffers its receiver posted), ``times`` the data's
        (a receive flow's G: the sender's transmit, its first progress)."""
        ranks = req.ranks
        g, n = ranks.shape
        c = req.channels
        fdir: np.ndarray
        if algo == RING:
            fdir = np.repeat([SEND, RECV], c)
            peers = np.concatenate(
                [
                    np.repeat(np.roll(ranks, -1, 1)[..., None], c, -1),
                    np.repeat(np.roll(ranks, 1, 1)[..., None], c, -1),
                ],
                -1,
            )
            kind = np.full(ranks.shape, OP_NAMES.index(req.kind))
        else:
            fdir = np.stack([np.full(c, SEND), np.full(c, RECV)])[None].repeat(g, 0)
            peers = np.repeat(ranks[:, ::-1, None], c, -1)
            kind = np.tile([OP_NAMES.index("send"), OP_NAMES.index("recv")], (g, 1))
        rows = g * n
        fdir = np.broadcast_to(fdir, (g, n, fdir.shape[-1])).reshape(rows, -1)
        nflow = fdir.shape[1]
        rank = ranks.ravel()
        return OpBlock(
            rank=rank.astype(np.int32),
            comm=np.repeat(req.comm, n),
            seq=np.repeat(req.seq, n).astype(np.int64),
            kind=kind.ravel().astype(np.uint8),
            algo=algo,
            proto=SIMPLE,
            nbytes=nbytes.ravel(),
            issue=req.issue.ravel().astype(np.float64),
            times=times.reshape(rows, 2, 3, 2, -1),
            fdir=fdir.astype(np.uint8),
            fchan=np.tile(np.arange(nflow) % c, (rows, 1)).astype(np.int16),
            fpeer=peers.reshape(rows, nflow).astype(np.int32),
            fcps=np.repeat(cps.reshape(rows, 1), nflow, 1).astype(np.int32),
            fdelta=np.tile(self.rng.exponential(5e-6, (rows, c)), (1, nflow // c)),
            slot=np.zeros(rows, dtype=np.int64),
            host=self.layout.host_of[rank].astype(np.int32),
            proc_dead=self.fx.proc_dead[rank],
            posted=posts.reshape(rows, 2, 2, -1),
            holds=holds.reshape(rows, 2, 3, 2, -1),
            nccl=self.hw.counters == "nccl",
        )


_NONE = (np.nan, np.nan)
"""No outage inside a counter's interval (``OpBlock.holds``)."""


def _put(out: np.ndarray, k: int, *pairs: tuple[Any, Any]) -> None:
    """Write step ``k`` of ``out`` ``(..., 3, 2, steps)``: ``[b, e]`` of G, T
    and D, each broadcast to the leading shape."""
    for i, (b, e) in enumerate(pairs):
        out[..., i, 0, k] = b
        out[..., i, 1, k] = e


def _cps(step_bytes: np.ndarray, channels: int, chunk: int) -> np.ndarray:
    """Chunks per ring step per channel (at least one)."""
    per_channel = -(-step_bytes // channels)
    cps: np.ndarray = np.maximum(1, -(-per_channel // chunk))
    return cps


def _ring_recv(send: np.ndarray, copy_s: np.ndarray, gdead: np.ndarray) -> np.ndarray:
    """Receive-side intervals of each rank from its ring predecessor."""
    prev = np.roll(send, 1, axis=1)
    recv = np.empty_like(send)
    recv[..., 0, :, :] = prev[..., 1, :, :]
    recv[..., 1, :, :] = prev[..., 2, :, :]
    recv[..., 2, :, :-1] = send[..., 0, :, 1:]
    arrived = prev[..., 2, 1, -1]
    recv[..., 2, 0, -1] = arrived
    consumed = arrived + copy_s
    recv[..., 2, 1, -1] = np.where(consumed > gdead, np.inf, consumed)
    return recv
