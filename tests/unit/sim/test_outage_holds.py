"""An outage inside a transfer holds its counters still: a stalled proxy
posts nothing while it is stalled (it does not post slowly), and the chunks
move over the rest of the stretched interval."""

from __future__ import annotations

import numpy as np

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.effects import Effects, Window
from mycroft.producers.sim.layout import build_layout
from mycroft.producers.sim.opblock import _progress


def _effects() -> Effects:
    cfg = SimConfig(tp=8, pp=2, dp=4)
    fx = Effects((), build_layout(cfg), 10.0, np.random.default_rng(0))
    mask = np.zeros(64, dtype=bool)
    mask[9] = True
    fx.pauses.append(Window(mask, 2.0, 3.0, flag=True))  # rank 9's proxy
    return fx


def test_a_stall_inside_a_transfer_stretches_it_and_is_kept() -> None:
    fx = _effects()
    src, dst, net = np.array([9, 9, 1]), np.array([41, 41, 33]), np.ones(3, bool)
    tb, te = np.array([1.5, 2.5, 1.5]), np.array([2.5, 2.8, 2.5])
    tb2, te2, hb, he = fx.pause(tb, te, src, dst, net, proxy=True)
    # Under way at the stall: one second longer, standing still over it.
    assert (tb2[0], te2[0], hb[0], he[0]) == (1.5, 3.5, 2.0, 3.0)
    # Posted during the stall: it starts when the proxy resumes.
    assert (tb2[1], np.isnan(hb[1])) == (3.0, True)
    # Another rank's transfer is untouched.
    assert (tb2[2], te2[2], np.isnan(hb[2])) == (1.5, 2.5, True)


def test_a_counter_stands_still_over_its_hold() -> None:
    b, e = np.array([1.5]), np.array([3.5])
    hb, he = np.array([2.0]), np.array([3.0])
    x = np.array([1.5, 1.75, 2.0, 2.5, 2.99, 3.25, 3.5, 4.0])
    frac, reached = _progress(x, b, e, hb, he)
    assert np.allclose(frac, [0.0, 0.25, 0.5, 0.5, 0.5, 0.75, 1.0, 1.0])
    assert np.allclose(reached(np.array([0.25, 0.5, 0.75])), [1.75, 2.0, 3.25])
    # Without a hold the interval moves linearly throughout.
    lin, _ = _progress(x, b, e, np.array([np.nan]), np.array([np.nan]))
    assert np.allclose(lin, np.clip((x - 1.5) / 2.0, 0.0, 1.0))
