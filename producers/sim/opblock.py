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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

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
    fprof: np.ndarray = field(init=False)
    first: np.ndarray = field(init=False)
    last: np.ndarray = field(init=False)
    start: np.ndarray = field(init=False)
    end: np.ndarray = field(init=False)
    steps: int = field(init=False)
    t_lo: float = field(init=False)
    t_hi: float = field(init=False)

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
        last = np.maximum(reach.max(axis=(-1, -2)), posted_last)
        return value, last + delta


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
        if hb is None or he is None:
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
