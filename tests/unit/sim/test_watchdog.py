"""``--watchdog-abort``: NCCL's watchdog and torchrun tear a blocked job down."""

from __future__ import annotations

import numpy as np
import pytest

from mycroft.errors import ConfigError
from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import resolve_faults
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.sim.layout import build_layout
from mycroft.producers.sim.watchdog import abort_times_s
from tests.unit.sim.trace import T0_NS, Trace, run, small_config

TIMEOUT_S = 2.0
HOST_SPREAD_S = 1.0  # the default
AT_S = 1.5


def _aborts(cfg: SimConfig, *specs: str, timeout_s: float = TIMEOUT_S) -> np.ndarray:
    faults = resolve_faults(cfg, [parse_spec(s) for s in specs])
    rng = np.random.default_rng(0)
    return abort_times_s(faults, timeout_s, build_layout(cfg), rng)


@pytest.mark.parametrize("fault", ["nic-down", "process-crash", "gpu-hang"])
def test_every_rank_aborts_after_a_blocking_fault(fault: str) -> None:
    cfg = small_config()
    t = _aborts(cfg, f"{fault}:rank=9,at={AT_S}")
    assert np.all(t >= AT_S + TIMEOUT_S)
    assert np.all(t < AT_S + TIMEOUT_S + HOST_SPREAD_S)
    per_host = t.reshape(cfg.hosts, -1)
    assert np.all(per_host == per_host[:, :1])  # a host's agent ends all its workers


@pytest.mark.parametrize(
    ("specs", "timeout_s"),
    [
        (("process-crash:rank=9,at=1.5",), 0.0),  # off
        (("nic-bandwidth:rank=9,at=1.5",), TIMEOUT_S),  # slow, not blocked
        (("nic-down:rank=9,at=1.5,duration=1",), TIMEOUT_S),  # back in time
        ((), TIMEOUT_S),
    ],
)
def test_no_abort_without_a_fault_that_outlasts_the_timeout(
    specs: tuple[str, ...], timeout_s: float
) -> None:
    assert np.all(np.isinf(_aborts(small_config(), *specs, timeout_s=timeout_s)))


def test_negative_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match="--watchdog-abort"):
        small_config(watchdog_abort_s=-1.0).validate()


@pytest.fixture(scope="module")
def torn_down() -> Trace:
    cfg = small_config(duration_s=6.0, watchdog_abort_s=TIMEOUT_S)
    return run(cfg, f"process-crash:rank=9,at={AT_S}")


def _tick_after(trace: Trace, t_s: float) -> int:
    """First tick whose sampling time (any host clock) is past ``t_s``."""
    cfg = trace.result.config
    slack_s = 3 * cfg.hardware.clock_offset_s + cfg.interval_s
    return int(np.ceil((t_s + slack_s) / cfg.interval_s))


def test_truth_names_the_teardown(torn_down: Trace) -> None:
    info = torn_down.result.truth()["watchdog_abort"]
    start = torn_down.result.trace_start_s
    assert info["timeout_s"] == TIMEOUT_S
    assert info["ranks"] == torn_down.result.config.ranks - 1  # all but the crashed
    assert info["first_s"] - start >= AT_S + TIMEOUT_S
    assert info["last_s"] - start < AT_S + TIMEOUT_S + HOST_SPREAD_S


def test_peers_run_until_the_abort_then_their_rings_freeze(torn_down: Trace) -> None:
    info = torn_down.result.truth()["watchdog_abort"]
    first_s = info["first_s"] - torn_down.result.trace_start_s
    last_s = info["last_s"] - torn_down.result.trace_start_s
    op, rc = torn_down.op, torn_down.rc
    peers_before = op["rank"][(op["tick"] > _tick_after(torn_down, AT_S))]
    assert len(set(peers_before.tolist()) - {9}) > 0  # peers wait in flight
    after = _tick_after(torn_down, last_s)
    assert not np.any(op["tick"] >= after)  # op and flow rows are gone
    late = rc["tick"] >= after
    assert len(set(rc["rank"][late].tolist())) == torn_down.result.config.ranks
    frozen_s = (rc["seen_ns"][late] - T0_NS) / 1e9
    assert np.all(frozen_s < last_s + 0.1)  # seen_ns stuck at the abort
    assert np.all(frozen_s[rc["rank"][late] != 9] > first_s - 0.2)


def test_heartbeats_keep_the_aborted_ranks_frozen(torn_down: Trace) -> None:
    last_s = torn_down.result.truth()["watchdog_abort"]["last_s"]
    beats = [h for h in torn_down.heartbeats() if h.ts_ns > (last_s + 1) * 1e9]
    assert beats
    for beat in beats:
        assert beat.ranks
        assert all(r.last_write_ns < (last_s + 0.1) * 1e9 for r in beat.ranks)


def test_off_by_default_leaves_the_truth_alone() -> None:
    trace = run(small_config(duration_s=3.0), "process-crash:rank=9,at=1.5")
    assert "watchdog_abort" not in trace.result.truth()
