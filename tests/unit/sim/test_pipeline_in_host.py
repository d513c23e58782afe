"""SimConfig(order="tp-pp-dp"): a whole pipeline inside one host."""

from __future__ import annotations

import numpy as np
import pytest

from mycroft.errors import ConfigError
from mycroft.producers.sim.config import SimConfig, Workload
from mycroft.producers.sim.layout import build_layout
from tests.unit.sim.trace import Trace, run


def _cfg(order: str) -> SimConfig:
    # 32 ranks, tp 2 x pp 4 x dp 4 on 4 hosts of 8 GPUs.
    return SimConfig(
        tp=2,
        pp=4,
        dp=4,
        duration_s=3.0,
        seed=2,
        workload=Workload(micro_batches=4),
        order=order,
    )


def test_grid_puts_each_pipeline_on_one_host() -> None:
    lay = build_layout(_cfg("tp-pp-dp"))
    assert lay.grid[:, 1, 0].tolist() == [8, 10, 12, 14]  # replica 1, tp 0
    hosts = lay.host_of[lay.grid]  # (pp, dp, tp)
    assert (hosts == np.arange(4)[None, :, None]).all()
    default = build_layout(_cfg("tp-dp-pp"))
    assert default.grid[:, 1, 0].tolist() == [2, 10, 18, 26]
    assert len(np.unique(default.host_of[default.grid[:, 1, 0]])) == 4


def _p2p(tr: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per p2p flow row: crosses hosts; per completed p2p op: duration ns."""
    fl, d = tr.flow, tr.done
    p2p = tr.of_kind(d, "send", "recv")
    return tr.net(fl)[tr.of_kind(fl, "send", "recv")], (d["end_ns"] - d["start_ns"])[
        p2p
    ]


def test_pipeline_transfers_go_over_nvlink() -> None:
    inside, across = run(_cfg("tp-pp-dp")), run(_cfg("tp-dp-pp"))
    net_in, dur_in = _p2p(inside)
    net_across, dur_across = _p2p(across)
    assert len(net_in) > 500 and not net_in.any()
    assert net_across.all()
    # 32 MiB at 150 GB/s NVLink vs 25 GB/s per GPU on the NIC.
    assert np.median(dur_across) > 4 * np.median(dur_in)
    # DP rings now cross hosts; TP stays inside.
    fl = inside.flow
    dp = inside.of_kind(fl, "reducescatter", "allgather")
    assert inside.net(fl)[dp].all()
    assert not inside.net(fl)[inside.of_kind(fl, "allreduce")].any()
    assert inside.result.truth()["order"] == "tp-pp-dp"
    assert "order" not in across.result.truth()


def test_unknown_order_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="order"):
        _cfg("pp-tp-dp").validate()
