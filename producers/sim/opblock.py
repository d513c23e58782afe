"""One collective (or p2p) op of many communicators at once, and its counters.

An :class:`OpBlock` holds the rows (rank x op) of one scheduled op across all
communicators of a role. Each row has flows (channel x peer x direction); the
progress of a flow is described per ring step ``k`` and per counter ``c`` (0:
gpu_ready, 1: transmitted, 2: done) by an interval ``[b, e]`` during which that
counter moves the step's ``cps`` chunks linearly. ``e = inf`` means the step
never finishes (a hang): the counter stops at the step's start. A flow's
intervals are ``times[row, fprof]``: by default its direction (all send flows
of a ring row move alike), or the row's ``profile`` (a tree row's flows to
parent and children each move their own way). Times are
float seconds since the simulation start on the reference clock.

An outage inside a step (a stalled proxy, a NIC down: ``Effects.pause``)
stretches its transmitted and done intervals; ``holds[row, fprof]`` keeps,
per counter and step, the part ``[hb, he]`` of ``[b, e]`` where the counter
stands still (NaN: none), so the chunks move over the rest of the interval
only (a stalled proxy posts nothing, it does not post slowly).

A receive flow's gpu_ready interval in ``times`` is the data's (the sender's
transmit: the rank's first progress, ``start``); it *reports* G as the
buffers its receiver posted, ``posted[row, fprof]`` (``schemas/ring.md``),
which never trail the data.

Within one counter the step intervals never overlap, and ``b``/``e`` of
gpu_ready <= transmitted <= done step by step, so the counters are monotone
and ``total >= gpu_ready >= transmitted >= done`` holds by construction.

With ``nccl`` set (``Hardware(counters="nccl")``) a send flow reports what
NCCL's profiler shows (``schemas/ring.md`` §4b, §4c): the proxy checks
readiness only for its head chunk (the one at ``transmitted``), so G is
``T + 1`` while that chunk's data is ready and not taken, else ``T``; the
time ready chunks waited at the head is :meth:`OpBlock.ready_wait`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mycroft.schemas.vocab import SEND

GPU_READY, TRANSMITTED, DONE = range(3)


@dataclass
class OpBlock:
    """Rows of one op of many communicators (shape ``R`` rows, ``F`` flows)."""

    rank: np.ndarray
    comm: np.ndarray
    seq: np.ndarray
    kind: np.ndarray
    algo: int
    proto: int
    nbytes: np.ndarray
    issue: np.ndarray
    times: np.ndarray
    fdir: np.ndarray
    fchan: np.ndarray
    fpeer: np.ndarray
    fcps: np.ndarray
    fdelta: np.ndarray
    slot: np.ndarray
    host: np.ndarray
    proc_dead: np.ndarray
    profile: np.ndarray | None = None
    posted: np.ndarray | None = None
    holds: np.ndarray | None = None
    nccl: bool = False
    fprof: np.ndarray = field(init=False)
    first: np.ndarray = field(init=False)
    last: np.ndarray = field(init=False)
    start: np.ndarray = field(init=False)
    end: np.ndarray = field(init=False)
    steps: int = field(init=False)
    t_lo: float = field(init=False)
    t_hi: float = field(init=False)
    _waits: list[tuple[np.ndarray, np.ndarray]] | None = field(
        init=False, default=None, repr=False
    )

    def __post_init__(self) -> None:
        rows = np.arange(len(self.rank))[:, None]
        self.fprof = self.fdir if self.profile is None else self.profile
        self.first = self.times[rows, self.fprof, GPU_READY, 0, 0] + self.fdelta
        self.last = self.times[rows, self.fprof, DONE, 1, -1] + self.fdelta
        self.start = self.first.min(axis=1)
        self.end = self.last.max(axis=1)
        self.steps = int(self.times.shape[-1])
        issued = np.isfinite(self.issue)
        self.t_lo = float(self.issue[issued].min()) if issued.any() else np.inf
        self.t_hi = float(self.end[issued].max()) if issued.any() else -np.inf

    @property
    def nflows(self) -> int:
        """Flows per row."""
        return int(self.fdir.shape[1])

    def total(self, rows: np.ndarray) -> np.ndarray:
        """Chunks each flow of ``rows`` moves for the op."""
        total: np.ndarray = self.fcps[rows] * self.steps
        return total

    def counters(
        self, rows: np.ndarray, t: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Counters ``(m, F, 3)`` and last-change time ``(m, F)`` at times ``t``.

        Args:
            rows: row indices to evaluate.
            t: evaluation time of each row (reference clock, seconds).

        Returns:
            Cumulative chunks per counter, and the time any counter of the flow
            last changed (``-inf``: never).
        """
        tf = self.times[rows[:, None], self.fprof[rows]]
        b, e = tf[..., 0, :], tf[..., 1, :]
        delta = self.fdelta[rows]
        x = (t[:, None] - delta)[:, :, None, None]
        cps = self.fcps[rows][:, :, None, None]
        hb = he = None
        if self.holds is not None:
            hf = self.holds[rows[:, None], self.fprof[rows]]
            hb, he = hf[..., 0, :], hf[..., 1, :]
        frac, reach_at = _progress(x, b, e, hb, he)
        with np.errstate(invalid="ignore", divide="ignore"):
            chunks = np.floor(frac * cps)
            reach = np.where(frac >= 1.0, e, reach_at(chunks / cps))
        reach = np.where(chunks > 0, reach, -np.inf)
        value = chunks.sum(axis=-1).astype(np.int32)
        if self.posted is not None:
            # A receive flow reports G as the buffers its receiver posted.
            recv = self.fdir[rows] == 1
            pb = self.posted[rows[:, None], self.fprof[rows]]
            pb_b, pb_e = pb[..., 0, :], pb[..., 1, :]
            px = x[..., 0, :]
            with np.errstate(invalid="ignore", divide="ignore"):
                pfrac = np.where(
                    px >= pb_e,
                    1.0,
                    np.where(px > pb_b, (px - pb_b) / (pb_e - pb_b), 0.0),
                )
            pchunks = np.floor(pfrac * cps[..., 0, :])
            pval = pchunks.sum(axis=-1).astype(np.int32)
            value[..., GPU_READY] = np.where(recv, pval, value[..., GPU_READY])
            # Posting a buffer changes a counter too (the schema's last_ns).
            preach = np.where(pchunks > 0, np.minimum(pb_e, px), -np.inf).max(-1)
            posted_last = np.where(recv, preach, -np.inf)
        else:
            posted_last = np.full(value.shape[:2], -np.inf)
        value[..., TRANSMITTED] = np.minimum(
            value[..., TRANSMITTED], value[..., GPU_READY]
        )
        value[..., DONE] = np.minimum(value[..., DONE], value[..., TRANSMITTED])
        if self.nccl:
            send = self.fdir[rows] == SEND
            head = np.minimum(value[..., GPU_READY], value[..., TRANSMITTED] + 1)
            g_reach = _reach_of(
                chunks[..., GPU_READY, :],
                head,
                cps[..., 0, :],
                reach_at,
                reach[..., GPU_READY, :],
            )
            reach[..., GPU_READY, :] = np.where(
                send[..., None], g_reach, reach[..., GPU_READY, :]
            )
            value[..., GPU_READY] = np.where(send, head, value[..., GPU_READY])
        last = np.maximum(reach.max(axis=(-1, -2)), posted_last)
        return value, last + delta

    def ready_wait(self, rows: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Seconds each flow of ``rows`` had its head chunk ready and not yet
        posted, summed over chunks, at times ``t`` (``(m, F)``; 0 on a
        receive flow).

        NCCL's send proxy posts the chunk at ``transmitted`` once its data is
        in the FIFO and the transport takes it (``isend``: the receiver's
        credit, a NIC that accepts it), and every chunk ready behind it right
        after. So a step's chunks wait once: its first chunk from the later
        of its data being ready and the previous step's last post until the
        step's post begins (``_step_waits``), and the head waits again
        while a stalled proxy holds the step's posts (``holds``); a post that
        never comes keeps it waiting.
        """
        spans = self._step_waits()
        x = (t[:, None] - self.fdelta[rows])[..., None]
        total = np.zeros((len(rows), self.nflows))
        for begin, end in spans:
            b, e = (a[rows[:, None], self.fprof[rows]] for a in (begin, end))
            with np.errstate(invalid="ignore"):
                total += np.clip(np.minimum(x, e) - b, 0.0, None).sum(axis=-1)
        out: np.ndarray = np.where(self.fdir[rows] == SEND, total, 0.0)
        return out

    def _step_waits(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per row, profile and step, the spans ``[begin, end]`` (s) during
        which the step's head chunk waited ready (NaN-free; empty: begin =
        end = inf)."""
        if self._waits is not None:
            return self._waits
        tf = self.times  # (R, P, counter, b/e, S)
        gb, ge = tf[:, :, GPU_READY, 0], tf[:, :, GPU_READY, 1]
        tb, te = tf[:, :, TRANSMITTED, 0], tf[:, :, TRANSMITTED, 1]
        c = self.fcps[:, :1, None].astype(np.float64)  # (R, 1, 1): one per row
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            ready0 = gb + (ge - gb) / c
            te_prev = np.concatenate(
                [np.full(te[..., :1].shape, -np.inf), te[..., :-1]], axis=-1
            )
            begin = np.where(np.isfinite(ready0), np.maximum(ready0, te_prev), np.inf)
            begin = np.where(np.isnan(begin), np.inf, begin)
            end = np.where(np.isfinite(te), np.maximum(ready0, tb), np.inf)
            end = np.where(np.isnan(end), np.inf, end)
            spans = [(begin, end)]
            if self.holds is not None:
                hb = self.holds[:, :, TRANSMITTED, 0]
                he = self.holds[:, :, TRANSMITTED, 1]
                held = np.isfinite(begin) & ~np.isnan(hb) & ~np.isnan(he)
                spans.append(
                    (
                        np.where(held, np.maximum(hb, begin), np.inf),
                        np.where(held, he, np.inf),
                    )
                )
        self._waits = spans
        return spans


def _reach_of(
    chunks: np.ndarray,
    target: np.ndarray,
    cps: np.ndarray,
    reach_at: Callable[[np.ndarray], np.ndarray],
    full: np.ndarray,
) -> np.ndarray:
    """Per step, when a counter whose steps hold ``chunks`` reached a total
    of ``target`` (``-inf``: a step it did not need)."""
    before = np.cumsum(chunks, axis=-1) - chunks
    need = np.clip(target[..., None] - before, 0, chunks)
    share = np.zeros((*need.shape[:-1], 3, need.shape[-1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        share[..., GPU_READY, :] = need / cps
        at = reach_at(share)[..., GPU_READY, :]
    out: np.ndarray = np.where(need <= 0, -np.inf, np.where(need >= chunks, full, at))
    return out


def _progress(
    x: np.ndarray,
    b: np.ndarray,
    e: np.ndarray,
    hb: np.ndarray | None,
    he: np.ndarray | None,
) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """Share of ``[b, e]`` done at ``x``, the counter standing still over
    ``[hb, he]`` (NaN: moving throughout), and the inverse: when a share was
    reached."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if hb is None or he is None or _no_holds(b, e, hb, he):
            frac = np.where(x >= e, 1.0, np.where(x > b, (x - b) / (e - b), 0.0))
            return frac, lambda share: b + share * (e - b)
        lo = np.where(np.isnan(hb), b, np.clip(hb, b, e))
        hi = np.where(np.isnan(he), b, np.clip(he, lo, e))
        held = hi - lo
        xc = np.clip(x, b, e)
        moving = (xc - b) - np.clip(np.minimum(xc, hi) - lo, 0.0, None)
        span = (e - b) - held
        frac = np.where(
            x >= e, 1.0, np.where(x > b, np.where(span > 0, moving / span, 0.0), 0.0)
        )

    def reached(share: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            at = b + share * span
            out: np.ndarray = np.where(at > lo, at + held, at)
        return out

    return frac, reached


def _no_holds(b: np.ndarray, e: np.ndarray, hb: np.ndarray, he: np.ndarray) -> bool:
    """Whether ``_progress`` may skip the outages: there are none, and every
    interval's ends give the plain share the same numbers (no NaN, no
    ``-inf`` start), the common case of a healthy op."""
    return bool(
        np.isnan(hb).all()
        and np.isnan(he).all()
        and not np.isnan(e).any()
        and not (np.isnan(b) | np.isneginf(b)).any()
    )
