"""Every fault of issue 3 leaves its signature in the trace (and only there).

Job: 64 ranks, tp 8, pp 2, dp 4 (host = d + 4 * stage). Rank 9 sits on host 1,
NIC 0 of that host (with rank 8); its DP ring is 1 -> 9 -> 17 -> 25.
"""

from __future__ import annotations

import numpy as np
import pytest

from mycroft.producers.sim.faults import FAULTS
from tests.unit.sim.trace import SEND, T0_NS, Trace, cached, stuck_flows

RANK = 9


def _after(tr: Trace, table: dict[str, np.ndarray], delay_s: float = 0.3) -> np.ndarray:
    return T0_NS + table["tick"] * 100_000_000 > tr.onset_ns + delay_s * 1e9


def _busy_net_sends(tr: Trace) -> np.ndarray:
    fl = tr.flow
    moving = (fl["gpu_ready"] > 0) & (fl["done"] < fl["total"])
    return (fl["dir"] == SEND) & tr.net(fl) & moving & _after(tr, fl)


def _last_in_group(tr: Trace, mask: np.ndarray, ranks: set[int], field: str) -> float:
    """Share of ops involving ``ranks`` where one of them has the max ``field``."""
    d = tr.done
    key = np.stack([d["comm"].view(np.int64)[mask], d["seq"][mask]], axis=1)
    _, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.ravel()
    rank, value = d["rank"][mask], d[field][mask]
    hits = []
    for g in range(inv.max() + 1):
        rows = inv == g
        if np.isin(rank[rows], list(ranks)).any() and rows.sum() > 1:
            hits.append(int(rank[rows][np.argmax(value[rows])]) in ranks)
    assert len(hits) >= 5
    return float(np.mean(hits))


def _dp_done_after(tr: Trace) -> np.ndarray:
    return tr.of_kind(tr.done, "reducescatter", "allgather") & _after(tr, tr.done)


def _hung(tr: Trace) -> None:
    """The job stops completing soon after the onset and flows stay stuck."""
    last_end_s = (tr.done["end_ns"].max() - tr.onset_ns) / 1e9
    assert last_end_s < 1.0
    assert stuck_flows(tr, 10).sum() > 20


def test_every_fault_in_the_table_is_known() -> None:
    assert len(FAULTS) == 14


def test_healthy_control_has_no_fault_signatures() -> None:
    tr = cached()
    fl = tr.flow
    busy = (fl["dir"] == SEND) & tr.net(fl) & (fl["gpu_ready"] > 0)
    assert (fl["gpu_ready"] - fl["transmitted"])[busy].mean() < 0.5
    assert (fl["transmitted"] - fl["done"])[busy].mean() < 0.5


def test_nic_bandwidth_gpu_ready_runs_ahead_of_transmitted_on_that_nic() -> None:
    tr = cached(f"nic-bandwidth:rank={RANK},at=2,severity=0.8")
    fl, busy = tr.flow, _busy_net_sends(tr)
    on_nic = np.isin(fl["rank"], tr.result.faults[0].ranks)
    gap = fl["gpu_ready"] - fl["transmitted"]
    assert gap[busy & on_nic].mean() > 2.0
    assert gap[busy & ~on_nic].mean() < 0.5
    assert tr.result.iterations < cached().result.iterations


def test_pcie_downgrade_rank_finishes_last_with_gpu_ready_lagging() -> None:
    tr = cached(f"pcie-downgrade:rank={RANK},at=2")
    assert _last_in_group(tr, _dp_done_after(tr), {RANK}, "end_ns") > 0.9
    fl = tr.flow
    mine = _busy_net_sends(tr) & (fl["rank"] == RANK)
    assert mine.any()
    assert (fl["gpu_ready"] - fl["transmitted"])[mine].mean() < 1.0


def test_gpu_power_cap_rank_starts_last() -> None:
    tr = cached(f"gpu-power-cap:rank={RANK},at=2")
    d = tr.done
    tp = tr.of_kind(d, "allreduce") & _after(tr, d)
    assert _last_in_group(tr, tp, {RANK}, "start_ns") > 0.9
    assert _last_in_group(tr, _dp_done_after(tr), {RANK}, "start_ns") > 0.9
    healthy = cached()
    before = tr.of_kind(healthy.done, "allreduce")
    assert _last_in_group(healthy, before, {RANK}, "start_ns") < 0.4


def test_gpu_background_load_slows_all_ranks_of_the_host() -> None:
    tr = cached("gpu-background-load:host=1,at=2")
    host_ranks = set(range(8, 16))
    assert set(tr.result.faults[0].ranks) == host_ranks
    assert _last_in_group(tr, _dp_done_after(tr), host_ranks, "start_ns") > 0.9


def test_net_background_traffic_done_lags_transmitted() -> None:
    tr = cached("net-background-traffic:host=1,at=2")
    fl, busy = tr.flow, _busy_net_sends(tr)
    on_host = fl["rank"] // 8 == 1
    lag = fl["transmitted"] - fl["done"]
    assert lag[busy & on_host].mean() > 1.0
    assert lag[busy & on_host].mean() > 3 * lag[busy & ~on_host].mean()
    assert (fl["gpu_ready"] - fl["transmitted"])[busy & on_host].mean() < 0.5


def test_proxy_delay_freezes_transmitted_while_gpu_ready_advances() -> None:
    tr = cached(f"proxy-delay:rank={RANK},at=2")
    fl = tr.flow
    window = _after(tr, fl, 0.1) & (
        T0_NS + fl["tick"] * 100_000_000 < tr.onset_ns + 1e9
    )
    mine = window & (fl["rank"] == RANK) & (fl["dir"] == SEND) & tr.net(fl)
    assert (fl["gpu_ready"] - fl["transmitted"])[mine].max() >= 4
    others = window & (fl["rank"] != RANK) & (fl["dir"] == SEND) & tr.net(fl)
    assert (fl["gpu_ready"] - fl["transmitted"])[others].max() <= 1
    assert (tr.done["end_ns"].max() - T0_NS) / 1e9 > tr.result.config.duration_s - 0.3


def test_link_flap_pauses_transmission_and_slows_the_job() -> None:
    tr = cached(f"link-flap:rank={RANK},at=2")
    fl = tr.flow
    nic = np.isin(fl["rank"], tr.result.faults[0].ranks)
    gap = fl["gpu_ready"] - fl["transmitted"]
    assert gap[_busy_net_sends(tr) & nic].max() >= 4
    assert tr.result.iterations < cached().result.iterations
    assert not stuck_flows(tr, 10).any()


def test_switch_congestion_slows_inter_host_flows_of_several_hosts() -> None:
    tr = cached("switch-congestion:host=0,at=2,count=4")
    assert tr.result.faults[0].hosts == (0, 1, 2, 3)
    d = tr.done
    dp = _dp_done_after(tr)
    dur = (d["end_ns"] - d["start_ns"]) / 1e6
    stage0 = d["rank"] < 32
    assert np.median(dur[dp & stage0]) > 1.5 * np.median(dur[dp & ~stage0])


def test_nic_down_freezes_the_nic_and_hangs_the_job() -> None:
    tr = cached(f"nic-down:rank={RANK},at=2")
    _hung(tr)
    d = tr.done
    nic = np.isin(d["rank"], tr.result.faults[0].ranks)
    net_done = np.isin(d["kind"], [0, 1, 2, 5, 6]) & nic
    assert d["end_ns"][nic].max() < d["end_ns"][~nic].max()
    assert d["end_ns"][net_done].max() < tr.onset_ns + 200_000_000
    last = tr.op["tick"] == tr.op["tick"].max()
    assert np.isin(tr.op["rank"][last], tr.result.faults[0].ranks).any()


def test_process_crash_rank_records_stop() -> None:
    tr = cached(f"process-crash:rank={RANK},at=2")
    _hung(tr)
    op_ticks = tr.op["tick"][tr.op["rank"] == RANK]
    assert T0_NS + op_ticks.max() * 100_000_000 < tr.onset_ns + 100_000_000
    rc = tr.rc
    seen = rc["seen_ns"][rc["rank"] == RANK]
    assert seen.max() <= tr.onset_ns
    assert rc["seen_ns"][rc["rank"] == RANK + 1].max() > tr.onset_ns + 3e9


def test_host_stall_rank_falls_behind_while_peers_wait() -> None:
    tr = cached(f"host-stall:rank={RANK},at=2")
    _hung(tr)
    rc, op = tr.rc, tr.op
    end = rc["tick"] == rc["tick"].max()
    mine = end & (rc["rank"] == RANK)
    behind = False
    for comm, issued in zip(rc["comm"][mine], rc["issued_seq"][mine], strict=True):
        peers = end & (rc["comm"] == comm) & (rc["rank"] != RANK)
        if (rc["issued_seq"][peers] > issued).any():
            waiting = (op["tick"] == op["tick"].max()) & (op["comm"] == comm)
            assert (op["seq"][waiting] == issued + 1).any()
            assert not (op["rank"][waiting] == RANK).any()
            behind = True
    assert behind
    # The process is alive (its host thread stalls): its liveness beat goes on.
    assert rc["seen_ns"][rc["rank"] == RANK].max() > tr.onset_ns + 3e9


def test_gpu_hang_rank_stays_alive_but_makes_no_progress() -> None:
    tr = cached(f"gpu-hang:rank={RANK},at=2")
    _hung(tr)
    op = tr.op
    last = (op["tick"] == op["tick"].max()) & (op["rank"] == RANK)
    assert last.sum() == 1
    rc = tr.rc
    assert rc["seen_ns"][rc["rank"] == RANK].max() > tr.onset_ns + 3e9
    fl = tr.flow
    mine = (fl["rank"] == RANK) & _after(tr, fl, 0.5)
    assert mine.any()
    key_done = fl["done"][mine] < fl["total"][mine]
    assert key_done.all()


def test_collective_mismatch_one_rank_disagrees_on_bytes() -> None:
    tr = cached(f"collective-mismatch:rank={RANK},at=2")
    _hung(tr)
    op = tr.op
    key = np.stack([op["comm"].view(np.int64), op["seq"]], axis=1)
    _, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.ravel()
    bad = [g for g in range(inv.max() + 1) if len(np.unique(op["bytes"][inv == g])) > 1]
    assert len(bad) == 1
    rows = inv == bad[0]
    values, counts = np.unique(op["bytes"][rows], return_counts=True)
    odd = values[np.argmin(counts)]
    assert set(op["rank"][rows & (op["bytes"] == odd)].tolist()) == {RANK}
    healthy = cached().op
    hkey = np.stack([healthy["comm"].view(np.int64), healthy["seq"]], axis=1)
    _, hinv = np.unique(hkey, axis=0, return_inverse=True)
    assert all(
        len(np.unique(healthy["bytes"][hinv.ravel() == g])) == 1
        for g in range(0, hinv.max() + 1, 7)
    )


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_truth_names_the_fault_and_trace_does_not(name: str) -> None:
    spec = (
        f"{name}:rank={RANK},at=2" if FAULTS[name].scope != "switch" else f"{name}:at=2"
    )
    tr = cached(spec)
    truth = tr.result.truth()
    entry = truth["faults"][0]
    assert entry["fault"] == name
    assert entry["kind"] == FAULTS[name].kind
    assert entry["component"] == FAULTS[name].component
    assert entry["onset_s"] == pytest.approx(truth["trace_start_s"] + 2.0)
    assert entry["at_s"] == 2.0
    if FAULTS[name].scope in ("rank", "nic"):
        assert entry["rank"] == RANK
    assert entry["hosts"]
    assert all(
        name.encode() not in r.header.job_id.encode()
        for _, r in tr.records
        if hasattr(r, "header")
    )


def _port(tr: Trace, host: str, nic: str) -> list[tuple[int, bool, int]]:
    """``(heartbeat time, up, link_downed)`` of port 1 of ``nic`` on ``host``."""
    return [
        (hb.ts_ns, p.up, p.link_downed)
        for hb in tr.heartbeats()
        if hb.host == host
        for p in hb.nics
        if p.nic == nic and p.port == 1
    ]


def test_nic_ports_go_down_only_on_the_faulty_nic() -> None:
    """Rank 9's NIC (host 1, mlx5_0) reports its outages in the heartbeats;
    the far end of its links, its other NIC and proxy stalls report none."""
    down = _port(cached(f"nic-down:rank={RANK},at=2"), "node0001", "mlx5_0")
    before = [(up, n) for t, up, n in down if t < T0_NS + 1.9e9]
    after = [(up, n) for t, up, n in down if t > T0_NS + 2.1e9]
    assert before == [(True, 0)] and after == [(False, 1)] * 4
    flap = cached(f"link-flap:rank={RANK},at=2")
    counts = [n for _, _, n in _port(flap, "node0001", "mlx5_0")]
    assert counts == sorted(counts) and counts[-1] >= 2
    quiet = [
        p
        for tr in (flap, cached(f"proxy-delay:rank={RANK},at=2"), cached())
        for hb in tr.heartbeats()
        for p in hb.nics
        if (hb.host, p.nic) != ("node0001", "mlx5_0") or tr is not flap
    ]
    assert quiet and all(p.up and p.link_downed == 0 for p in quiet)
    assert len(cached().heartbeats()[0].nics) == 4
