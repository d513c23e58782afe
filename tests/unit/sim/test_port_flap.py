"""port-flap: a NIC fault that shows in its port counters, hardly in flows.

Job of ``trace.small_config``: rank 9 sits on host 1 behind NIC mlx5_0 (with
rank 8); its DP ring is 1 -> 9 -> 17 -> 25.
"""

from __future__ import annotations

import numpy as np

from mycroft.producers.sim.faults import FAULTS
from tests.unit.sim.trace import SEND, T0_NS, Trace, cached

SPEC = "port-flap:rank=9,at=2,severity=0.1"


def _ports(tr: Trace) -> dict[tuple[str, str], list[tuple[bool, int, int]]]:
    out: dict[tuple[str, str], list[tuple[bool, int, int]]] = {}
    for hb in tr.heartbeats():
        for p in hb.nics:
            out.setdefault((hb.host, p.nic), []).append(
                (p.up, p.link_downed, p.link_recovered)
            )
    return out


def test_truth_blames_the_nic_and_its_ranks() -> None:
    entry = cached(SPEC).result.truth()["faults"][0]
    assert FAULTS["port-flap"].scope == "nic"
    assert (entry["component"], entry["kind"]) == ("nic", "slowdown")
    assert entry["ranks"] == [8, 9] and entry["rank"] == 9
    assert entry["params"] == {"period": 0.5, "down": 0.003}


def test_port_counters_rise_on_that_nic_only() -> None:
    ports = _ports(cached(SPEC))
    flapping = ports.pop(("node0001", "mlx5_0"))
    downed = [n for _, n, _ in flapping]
    recovered = [n for _, _, n in flapping]
    # Heartbeats at 1..6 s; retrains every 0.5 s from 2 s.
    assert downed == [0, 1, 3, 5, 7, 8]
    assert recovered == [0, 0, 2, 4, 6, 8]
    assert all(p == (True, 0, 0) for ps in ports.values() for p in ps)


def _dp_send_ms(tr: Trace) -> float:
    f = tr.done_flow
    mine = (f["rank"] == 9) & (f["dir"] == SEND) & (f["first_ns"] > T0_NS + 2.2e9)
    mine &= tr.of_kind(f, "reducescatter", "allgather")
    return float(np.median(f["last_ns"][mine] - f["first_ns"][mine])) / 1e6


def test_flows_only_a_little_slower() -> None:
    healthy, flapping = cached(), cached(SPEC)
    slower = _dp_send_ms(flapping) / _dp_send_ms(healthy)
    assert 1.03 < slower < 1.2
    assert flapping.result.iterations == healthy.result.iterations
