"""Escalation is a consequence, not a cause: after a fault blocks the job,
NCCL's watchdog and torchrun tear every rank down (the simulator's
``--watchdog-abort``); the first failure stays the culprit of its incident,
and no rank the teardown took is named, by a new incident or a revision."""

from __future__ import annotations

import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import SimResult, simulate
from mycroft.producers.sim.faults import Fault, parse_spec
from mycroft.schemas.records import Anomaly, Culprit, RootCause
from mycroft.streams.analyze import Replay
from mycroft.streams.core.escalation import exited_after_a_death

S = 1_000_000_000
AT_S, TIMEOUT_S, DURATION_S = 4.0, 3.0, 14.0


def _job(
    fault: str, seed: int, spread_s: float = 1.0
) -> tuple[SimResult, list[RootCause], list[Anomaly]]:
    """32 ranks (tp 8, pp 2, dp 2) on 4 hosts, torn down ``spread_s`` apart;
    every revision the core sent and every anomaly."""
    cfg = SimConfig(
        tp=8,
        pp=2,
        dp=2,
        duration_s=DURATION_S,
        seed=seed,
        watchdog_abort_s=TIMEOUT_S,
        watchdog_spread_s=spread_s,
    )
    rp = Replay()
    result = simulate(cfg, [parse_spec(f"{fault}:at={AT_S}")], rp)
    anomalies, _ = rp.finish()
    return result, rp.revisions, anomalies


def _is_the_fault(c: Culprit, fault: Fault) -> bool:
    same = c.rank in fault.ranks or bool(set(c.ranks) & set(fault.ranks))
    return same and c.component.value == fault.info.component


@pytest.mark.parametrize(
    ("fault", "seed"), [("nic-down", 11), ("process-crash", 12), ("gpu-hang", 13)]
)
def test_the_first_failure_stays_the_culprit_after_the_teardown(
    fault: str, seed: int
) -> None:
    result, revisions, _ = _job(fault, seed)
    (truth,) = result.faults
    abort = result.truth()["watchdog_abort"]
    assert abort["ranks"] >= result.config.ranks - len(truth.ranks)
    first_abort_ns = round(abort["first_s"] * S)
    assert abort["last_s"] - result.trace_start_s < DURATION_S - 4  # seen after it
    assert revisions, "the fault was not diagnosed at all"
    assert revisions[0].resolved_ns < first_abort_ns  # named before the teardown
    for rc in revisions:
        assert rc.onset_ns < first_abort_ns, f"a new incident at the teardown: {rc}"
        assert _is_the_fault(rc.culprits[0], truth), f"culprit swapped: {rc}"


@pytest.mark.parametrize("fault", ["process-crash", "gpu-hang"])
def test_hosts_torn_down_seconds_apart_are_no_new_silence(fault: str) -> None:
    """The first hosts' ranks go while the last hosts' still wait on them:
    they stopped after the failure did, so no silence names them."""
    result, revisions, anomalies = _job(fault, 21, spread_s=4.0)
    (truth,) = result.faults
    silent = {r for a in anomalies if a.detector == "silence" for r in a.ranks}
    assert silent <= set(truth.ranks), f"teardown read as silence: {sorted(silent)}"
    assert revisions
    assert all(_is_the_fault(rc.culprits[0], truth) for rc in revisions)


MS = 1_000_000


@pytest.mark.parametrize(
    ("lost", "want"),
    [
        # a peer's ring vanished 150 ms after the crashed rank's last beat
        ({3: ("seen", 1000 * MS), 0: ("rows", 1150 * MS)}, {0}),
        # ... or 100 ms before it (one beat and one tick cannot order them)
        ({3: ("seen", 1000 * MS), 0: ("rows", 900 * MS)}, {0}),
        # a ring that vanished well before the death is a cause of its own
        ({3: ("seen", 1000 * MS), 0: ("rows", 500 * MS)}, set()),
        # only exits, or only deaths: nothing tells them apart
        ({3: ("rows", 1000 * MS), 0: ("rows", 1100 * MS)}, set()),
        ({3: ("seen", 1000 * MS), 0: ("seen", 1100 * MS)}, set()),
    ],
)
def test_an_exit_near_a_death_is_its_consequence(
    lost: dict[int, tuple[str, int]], want: set[int]
) -> None:
    assert exited_after_a_death(lost, 300 * MS) == want
