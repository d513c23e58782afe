"""The training program of every rank: micro-batches, then the DP step.

The micro-batches run as GPipe (default), 1F1B or interleaved 1F1B over
``virtual_stages`` model chunks (``Workload.schedule``).

One iteration, all stages at once (each call covers every DP x TP replica)::

    forward  j = 0..m-1, stage s = 0..pp-1:
        recv activations from s-1 (pair comm), then tp_allreduces x
        (compute segment, TP allreduce)
    backward j = 0..m-1, stage s = pp-1..0:
        recv gradients from s+1, then tp_allreduces x (compute, TP allreduce)
    DP: reducescatter(gradients), optimizer compute, allgather(parameters)

``ready[r]`` is when rank ``r``'s GPU stream is free for its next kernel. The
CPU runs ahead: it enqueues (issues) an op while the compute before it still
runs (up to ``RUNAHEAD`` of that compute), so ops sit in flight with zero
progress before they start, as under PyTorch. A recv therefore waits in
flight through the pipeline bubble.

1F1B (PipeDream-Flush, Megatron's default): stage ``s`` runs
``min(pp - s - 1, m)`` warm-up forwards, then alternates one forward and one
backward, then drains the remaining backwards. The stages' sequences are
merged in passes over ``s = 0..pp-1``, taking each stage's next step once
its input exists; a step pulls the pipeline transfer that feeds it, so the
sender's side of the pair sits where the sender's program had got to.
Interleaved 1F1B merges the same way over ``(forward, chunk, micro-batch)``
steps: chunk ``c`` of stage 0 is fed by chunk ``c - 1`` of stage ``pp - 1``
(forward) over the wrap pair, and the reverse going backward.
"""

from __future__ import annotations

import numpy as np

from mycroft.producers.sim.collective import OpRequest, Physics
from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.effects import Effects
from mycroft.producers.sim.layout import DP, PP_NEXT, PP_PREV, TP, Layout
from mycroft.producers.sim.opblock import OpBlock
from mycroft.producers.sim.phases import Phase, PhaseClock
from mycroft.producers.sim.tree import tree_allreduce

RUNAHEAD = 0.8
"""Default fraction of the preceding compute during which the CPU enqueues the
next op (``Hardware.runahead``)."""
CPU_OP_S = 50e-6
CPU_OP_FRAC = 0.05
"""Under ``Hardware.runahead_ops`` the CPU spends ``CPU_OP_S`` plus this
fraction of the GPU's compute before an op on launching it (a GPU-bound
job's Python is about 20x faster than its kernels)."""


MOE_STREAM = 7
"""Seed-sequence key of the MoE token-routing draws (``SimConfig.seed``, 7)."""
MOE_ROUTING_NOISE = 0.1
"""Log-normal sigma of one rank's deviation from the experts' popularity:
ranks' tokens prefer the same experts, not identically."""


def moe_sizes(
    rng: np.random.Generator, shape: tuple[int, ...], tokens_bytes: int, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank input bytes of one MoE layer's dispatch and combine.

    Each of the ``shape = (groups, n)`` ranks routes its ``tokens_bytes`` to
    the ``n`` experts of its group (one per rank) in proportion to the
    experts' popularity this call (log-normal, sigma ``sigma``). Dispatch
    sends every rank's tokens (sizes agree); combine sends each expert's
    results back, so its sizes are the tokens each expert received (they
    differ: the imbalance).

    Returns:
        ``(dispatch, combine)`` bytes, each of ``shape``.
    """
    groups, n = shape
    popular = rng.lognormal(0.0, sigma, (groups, 1, n))
    share = popular * rng.lognormal(0.0, MOE_ROUTING_NOISE, (groups, n, n))
    share /= share.sum(axis=2, keepdims=True)
    routed = np.floor(share * tokens_bytes)  # [group, sender, expert]
    dispatch = np.full(shape, tokens_bytes, dtype=np.int64)
    return dispatch, np.maximum(routed.sum(axis=1), 1).astype(np.int64)


def interleaved(pp: int, m: int, v: int, s: int) -> list[tuple[bool, int, int]]:
    """Stage ``s``'s interleaved 1F1B order over ``v`` model chunks:
    ``(forward, chunk, micro-batch)`` per step (Megatron's schedule)."""
    total = m * v

    def step(k: int, forward: bool) -> tuple[bool, int, int]:
        chunk = k % (pp * v) // pp
        mb = k // (pp * v) * pp + k % pp
        return forward, chunk if forward else v - 1 - chunk, mb

    warm = min((pp - s - 1) * 2 + (v - 1) * pp, total)
    out = [step(k, True) for k in range(warm)]
    for i in range(total - warm):
        out += [step(warm + i, True), step(i, False)]
    out += [step(i, False) for i in range(total - warm, total)]
    return out


def one_f_one_b(pp: int, m: int, s: int) -> list[tuple[bool, int]]:
    """Stage ``s``'s 1F1B order: ``(forward, micro-batch)`` per step."""
    warm = min(pp - s - 1, m)
    out = [(True, j) for j in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            out.append((True, f))
            f += 1
        out.append((False, b))
        b += 1
    return out


class Schedule:
    """Advance all ranks one iteration at a time, collecting op blocks."""

    def __init__(
        self,
        cfg: SimConfig,
        layout: Layout,
        effects: Effects,
        physics: Physics,
        rng: np.random.Generator,
    ) -> None:
        self.cfg = cfg
        self.wl = cfg.workload
        self.layout = layout
        self.fx = effects
        self.phys = physics
        self.rng = rng
        n = layout.nranks
        self.ready = rng.uniform(0.0, 0.01, n)
        self.started = self.ready.copy()
        self.cpu = self.ready.copy()
        self.segment = np.zeros(n)
        host_speed = 1.0 + 0.01 * rng.standard_normal(layout.nhosts)
        self.speed = np.clip(host_speed, 0.97, 1.03)[layout.host_of]
        self.tp_seq = np.zeros(len(layout.tp.comm), dtype=np.int64)
        self.dp_seq = np.zeros(len(layout.dp.comm), dtype=np.int64)
        self.pp_seq = [np.zeros(len(g.comm), dtype=np.int64) for g in layout.pp]
        self.blocks: list[OpBlock] = []
        self.iterations = 0
        # Run-ahead in ops: start times of each rank's last `ahead` ops.
        self.ahead = cfg.hardware.runahead_ops
        self.queue = np.full((max(self.ahead, 1), n), -np.inf)
        self.nops = np.zeros(n, dtype=np.int64)
        # Token routing draws from a stream of its own: MoE leaves others' draws.
        self.moe_rng = np.random.default_rng([cfg.seed, MOE_STREAM])
        self.phases = PhaseClock(cfg.phases)
        self.resume = 1.0  # compute multiplier of the iteration after a pause

    @property
    def horizon_s(self) -> float:
        """No op issued from now on starts before this time."""
        live = self.ready[np.isfinite(self.ready)]
        return float(live.min()) if len(live) else np.inf

    def iteration(self) -> None:
        """Schedule the next phase of every rank: one training iteration,
        after a checkpoint when one is due, or an evaluation phase."""
        phase = self.phases.at(self._now_s())
        if phase is Phase.EVAL:
            self._evaluate()
            return
        if phase is Phase.CHECKPOINT:
            self._checkpoint()
        self._train()
        self.resume = 1.0

    def _now_s(self) -> float:
        """The newest live GPU clock: where the job has got to."""
        live = self.ready[np.isfinite(self.ready)]
        return float(live.max()) if len(live) else np.inf

    def _checkpoint(self) -> None:
        """Every rank stops together (a barrier, then the save), or rank 0
        alone while the others go on into the next collective and wait."""
        ph = self.cfg.phases
        if ph.checkpoint_ranks == "all":
            at = np.isfinite(self.ready)
            self.ready[at] = self._now_s() + ph.checkpoint_s
        else:
            self.ready[0] += ph.checkpoint_s
        if self.ahead:
            self.cpu = np.maximum(
                self.cpu, np.where(np.isfinite(self.ready), self.ready, self.cpu)
            )
        self.resume = ph.resume_slowdown

    def _evaluate(self) -> None:
        """Forward passes only: pipeline sends and TP all-reduces, no
        backward and no data-parallel step."""
        for _ in range(self.cfg.phases.eval_iterations):
            for _ in range(self.wl.micro_batches):
                for s in range(self.cfg.pp):
                    if s > 0:
                        self._pipe(s - 1, forward=True)
                    self._stage(s, self.wl.fwd_compute_s)
            self._end_iteration()
        self.resume = self.cfg.phases.resume_slowdown

    def _train(self) -> None:
        """One full training iteration of every rank."""
        m, pp = self.wl.micro_batches, self.cfg.pp
        if self.wl.schedule != "gpipe":
            self._one_f_one_b()
            self._data_parallel()
            self._end_iteration()
            return
        for _ in range(m):
            for s in range(pp):
                if s > 0:
                    self._pipe(s - 1, forward=True)
                self._stage(s, self.wl.fwd_compute_s)
        for _ in range(m):
            for s in reversed(range(pp)):
                if s < pp - 1:
                    self._pipe(s, forward=False)
                self._stage(s, self.wl.bwd_compute_s)
        self._data_parallel()
        self._end_iteration()

    def _end_iteration(self) -> None:
        if self.ahead:
            # The loss / grad-norm read at the end of a step syncs the CPU.
            self.cpu = np.maximum(self.cpu, self.ready)
        self.iterations += 1

    def _one_f_one_b(self) -> None:
        m, pp, v = self.wl.micro_batches, self.cfg.pp, self.wl.virtual_stages
        order = [
            interleaved(pp, m, v, s)
            if v > 1
            else [(f, 0, j) for f, j in one_f_one_b(pp, m, s)]
            for s in range(pp)
        ]
        pos = [0] * pp
        done: set[tuple[bool, int, int, int]] = set()
        while any(pos[s] < len(order[s]) for s in range(pp)):
            moved = False
            for s in range(pp):
                if pos[s] == len(order[s]):
                    continue
                forward, c, j = order[s][pos[s]]
                feed = self._feed(s, forward, c)
                if feed is not None and (forward, *feed, j) not in done:
                    continue
                if feed is not None:
                    # The pair feeding s; pair pp-1 is the wrap (pp-1, 0).
                    wrap = s == 0 if forward else s == pp - 1
                    self._pipe(pp - 1 if wrap else s - forward, forward)
                seconds = self.wl.fwd_compute_s if forward else self.wl.bwd_compute_s
                self._stage(s, seconds / v, v)
                done.add((forward, s, c, j))
                pos[s] += 1
                moved = True
            if not moved:
                raise RuntimeError("1F1B schedule made no progress")

    def _feed(self, s: int, forward: bool, c: int) -> tuple[int, int] | None:
        """Stage and chunk whose step feeds ``(forward, s, c)`` (None: the
        first chunk's forward on stage 0, the last's backward on pp-1)."""
        pp, v = self.cfg.pp, self.wl.virtual_stages
        if forward:
            if s > 0:
                return s - 1, c
            return (pp - 1, c - 1) if c > 0 else None
        if s < pp - 1:
            return s + 1, c
        return (0, c + 1) if c < v - 1 else None

    def _compute(self, ranks: np.ndarray, seconds: float) -> None:
        t = self.ready[ranks]
        jitter = np.exp(
            self.cfg.hardware.jitter * self.rng.standard_normal(ranks.shape)
        )
        slow = self.rng.random(ranks.shape) < self.wl.straggler_prob
        jitter = np.where(slow, jitter * (1 + self.wl.straggler_slowdown), jitter)
        mult = self.fx.compute_mult(ranks, t) * self.speed[ranks]
        duration = seconds * jitter * mult * self.resume
        self.ready[ranks] = t + duration
        self.segment[ranks] = duration

    def _issue(self, ranks: np.ndarray) -> np.ndarray:
        """CPU enqueue times of the next op of ``ranks`` (stalls applied).

        By default the CPU enqueues the op during the compute before it
        (``runahead`` of it); with ``runahead_ops = N`` it runs on and
        enqueues op ``k`` once the GPU has started op ``k - N``.
        """
        if self.ahead:
            busy = CPU_OP_S + CPU_OP_FRAC * self.segment[ranks]
            queued = self.queue[self.nops[ranks] % self.ahead, ranks]
            t = np.maximum(self.cpu[ranks] + busy, queued)
        else:
            ahead = self.ready[ranks] - self.cfg.hardware.runahead * self.segment[ranks]
            t = np.maximum(self.cpu[ranks], ahead)
        t = self.fx.take_stall(ranks, t)
        t = np.where(t > self.fx.proc_dead[ranks], np.inf, t)
        self.cpu[ranks] = t
        self.segment[ranks] = 0.0
        return t

    def _stage(self, s: int, seconds: float, chunks: int = 1) -> None:
        """One pass of stage ``s`` (one of ``chunks`` model chunks: its share
        of the layers, so of the TP all-reduces)."""
        grid = self.layout.grid[s]
        ranks = grid.reshape(-1, self.cfg.tp)
        count = max(1, self.wl.tp_allreduces // chunks)
        for _ in range(count):
            self._compute(grid, seconds / count)
            if self.cfg.tp > 1:
                rows = np.arange(s * self.cfg.dp, (s + 1) * self.cfg.dp)
                self._ring("allreduce", TP, ranks, rows, self.wl.tp_bytes)
                if self.wl.moe_bytes:
                    self._moe(ranks, rows)

    def _moe(self, ranks: np.ndarray, rows: np.ndarray) -> None:
        """An MoE layer's dispatch and combine all-to-alls over the TP group
        (its expert-parallel group), with this call's token imbalance."""
        dispatch, combine = moe_sizes(
            self.moe_rng, ranks.shape, self.wl.moe_bytes, self.wl.moe_imbalance
        )
        for sizes in (dispatch, combine):
            self._ring("alltoall", TP, ranks, rows, self.wl.moe_bytes, row_bytes=sizes)

    def _ring(
        self,
        kind: str,
        role: int,
        ranks: np.ndarray,
        rows: np.ndarray,
        nbytes: int,
        *,
        row_bytes: np.ndarray | None = None,
    ) -> None:
        group = self.layout.tp if role == TP else self.layout.dp
        seqs = self.tp_seq if role == TP else self.dp_seq
        hw = self.cfg.hardware
        channels = hw.tp_channels if role == TP else hw.dp_channels
        issue = self._issue(ranks)
        req = OpRequest(
            kind,
            ranks,
            group.comm[rows],
            seqs[rows].copy(),
            issue,
            nbytes,
            channels,
            self.ready[ranks],
            row_bytes,
        )
        mismatch_role = DP if self.cfg.dp > 1 else TP
        culprit = self.fx.take_mismatch(ranks, issue) if role == mismatch_role else None
        if kind == "allreduce" and hw.allreduce == "tree":
            for block in tree_allreduce(self.phys, req, culprit):
                self._add(block, role)
        else:
            self._add(self.phys.ring(req, culprit), role)
        seqs[rows] += 1

    def _pipe(self, p: int, forward: bool) -> None:
        group = self.layout.pp[p]
        pairs = group.ranks if forward else group.ranks[:, ::-1]
        issue = self._issue(pairs)
        req = OpRequest(
            "send",
            pairs,
            group.comm,
            self.pp_seq[p].copy(),
            issue,
            self.wl.pp_bytes,
            self.cfg.hardware.pp_channels,
            self.ready[pairs],
        )
        block = self.phys.p2p(req)
        roles = np.tile(
            [PP_NEXT, PP_PREV] if forward else [PP_PREV, PP_NEXT], len(pairs)
        )
        self._add(block, roles)
        if self.ahead:
            # Megatron waits for a pipeline exchange before going on.
            self.cpu[block.rank] = np.maximum(self.cpu[block.rank], block.end)
        self.pp_seq[p] += 1

    def _data_parallel(self) -> None:
        grid = self.layout.grid
        if self.cfg.dp < 2:
            self._compute(grid.ravel(), self.wl.optimizer_s)
            return
        ranks = self.layout.dp.ranks
        rows = np.arange(len(ranks))
        if self.wl.dp_allreduce:
            self._ring("allreduce", DP, ranks, rows, self.wl.dp_bytes)
            self._compute(grid.ravel(), self.wl.optimizer_s)
            return
        self._ring("reducescatter", DP, ranks, rows, self.wl.dp_bytes)
        self._compute(grid.ravel(), self.wl.optimizer_s)
        self._ring("allgather", DP, ranks, rows, self.wl.dp_bytes)

    def _add(self, block: OpBlock, role: int | np.ndarray) -> None:
        block.slot = self.layout.slot_of[block.rank, role]
        self.ready[block.rank] = block.end
        if self.ahead:
            self.queue[self.nops[block.rank] % self.ahead, block.rank] = block.start
            self.nops[block.rank] += 1
        if np.isfinite(block.issue).any():
            self.blocks.append(block)
