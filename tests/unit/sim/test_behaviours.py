"""Opt-in behaviours: 1F1B order, clock drift, run-ahead and benign noise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mycroft.errors import ConfigError
from mycroft.producers.sim.config import Hardware, Noise, SimConfig, Workload
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.sim.schedule import one_f_one_b
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import CompletionBatch, Heartbeat, StateBatch, Topology
from mycroft.schemas.vocab import OP_NAMES

BASE = SimConfig(
    tp=2,
    pp=4,
    dp=2,
    duration_s=2.0,
    seed=3,
    hardware=Hardware(gpus_per_host=4),
    workload=Workload(micro_batches=6),
)
"""16 ranks on 4 hosts of 4 GPUs: a 4-stage pipeline, TP 2, DP 2."""


def _cfg(**kw: object) -> SimConfig:
    return dataclasses.replace(BASE, **kw)  # type: ignore[arg-type]


def test_one_f_one_b_order_per_stage() -> None:
    # Last stage alternates from the start; the first warms up pp-1 forwards.
    assert one_f_one_b(4, 6, 3) == [
        (True, 0), (False, 0), (True, 1), (False, 1), (True, 2), (False, 2),
        (True, 3), (False, 3), (True, 4), (False, 4), (True, 5), (False, 5),
    ]  # fmt: skip
    first = one_f_one_b(4, 6, 0)
    assert first[:4] == [(True, 0), (True, 1), (True, 2), (True, 3)]
    assert first[4] == (False, 0)
    for s in range(4):
        steps = one_f_one_b(4, 6, s)
        assert sorted(steps) == sorted(
            {(f, j) for f in (True, False) for j in range(6)}
        )
        # Never more than pp - s forwards in flight (the 1F1B memory bound).
        inflight = np.cumsum([1 if f else -1 for f, _ in steps])
        assert inflight.max() == min(4 - s, 6)


def test_one_f_one_b_interleaves_backward_on_first_stage() -> None:
    # Under GPipe stage 0 issues all its forward sends before any backward
    # recv; under 1F1B a backward recv comes before the last forward send.
    def first_recv_before_last_send(schedule: str) -> bool:
        cfg = _cfg(workload=Workload(micro_batches=6, schedule=schedule))
        w = ListWriter()
        simulate(cfg, [], w)
        issues: dict[tuple[int, int, int], tuple[int, int]] = {}
        for _, rec in w.records:
            if isinstance(rec, StateBatch | CompletionBatch):
                o = rec.op
                for i in np.flatnonzero(o["rank"] == 0):
                    key = (int(o["comm"][i]), int(o["seq"][i]), int(o["kind"][i]))
                    issues.setdefault(key, (int(o["issue_ns"][i]), int(o["kind"][i])))
        send, recv = OP_NAMES.index("send"), OP_NAMES.index("recv")
        ts = sorted(issues.values())
        sends = [t for t, k in ts if k == send]
        recvs = [t for t, k in ts if k == recv]
        assert sends and recvs
        # first iteration only: the first m sends
        return min(recvs) < sends[5]

    assert not first_recv_before_last_send("gpipe")
    assert first_recv_before_last_send("1f1b")


def test_unknown_schedule_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="schedule"):
        _cfg(workload=Workload(schedule="zb")).validate()


def _heartbeats(cfg: SimConfig) -> list[Heartbeat]:
    w = ListWriter()
    simulate(cfg, [], w)
    return [r for _, r in w.records if isinstance(r, Heartbeat)]


def test_clock_drift_applied_per_host() -> None:
    cfg = _cfg(duration_s=4.0, hardware=Hardware(gpus_per_host=4, clock_drift_ppm=50))
    w = ListWriter()
    res = simulate(cfg, [], w)
    assert len(res.drift_ppm) == cfg.hosts
    assert len(set(res.drift_ppm)) == cfg.hosts  # each host its own rate
    assert max(abs(d) for d in res.drift_ppm) <= 150
    assert res.truth()["clock_drift_ppm"] == list(res.drift_ppm)

    # Op issue times of one host move apart from the undrifted run by
    # drift x elapsed: compare the last op row each host reported.
    def last_issue(writer: ListWriter) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, rec in writer.records:
            if isinstance(rec, StateBatch) and len(rec.op):
                out[rec.header.host] = int(rec.op["issue_ns"].max())
        return out

    w0 = ListWriter()
    base = simulate(_cfg(duration_s=4.0), [], w0)
    assert base.offsets_s == res.offsets_s and "clock_drift_ppm" not in base.truth()
    drifted, exact = last_issue(w), last_issue(w0)
    assert drifted.keys() == exact.keys()
    assert all(drifted[h] != exact[h] for h in exact)


def test_noise_events_present_on_healthy_runs() -> None:
    noise = Noise(
        gc_pauses_per_min=30,
        proxy_hiccups_per_min=60,
        wire_bursts_per_min=60,
        storage_nics=1,
        port_counters_base=7,
    )
    cfg = _cfg(duration_s=6.0, noise=noise)
    res = simulate(cfg, [], ListWriter())
    kinds = {e[0] for e in res.noise_events}
    assert kinds == {"gc-pause", "proxy-hiccup", "wire-burst"}
    for kind, _, t0, t1 in res.noise_events:
        lo, hi = {
            "gc-pause": noise.gc_pause_s,
            "proxy-hiccup": noise.proxy_hiccup_s,
            "wire-burst": noise.wire_burst_s,
        }[kind]
        assert lo <= t1 - t0 <= hi and 0 <= t0 <= cfg.duration_s
    assert res.truth()["faults"] == []
    hbs = _heartbeats(cfg)
    names = {p.nic for hb in hbs for p in hb.nics}
    assert "mlx5_2" in names  # 4 GPUs, 2 per NIC: mlx5_0, mlx5_1 + storage
    assert all(p.link_downed == 7 and p.up for hb in hbs for p in hb.nics)


def test_gc_pause_delays_issue() -> None:
    quiet = simulate(_cfg(duration_s=3.0), [], ListWriter())
    noisy = simulate(
        _cfg(duration_s=3.0, noise=Noise(gc_pauses_per_min=600, gc_pause_s=(0.2, 0.2))),
        [],
        ListWriter(),
    )
    assert noisy.iterations < quiet.iterations


def test_runahead_issues_during_the_compute() -> None:
    # Rank 0's first op is the TP allreduce after the first compute segment
    # (fwd 20 ms / 2): run-ahead 0.8 issues it ~8 ms before run-ahead 0.
    first = {}
    for ra in (0.0, 0.8):
        w = ListWriter()
        simulate(_cfg(hardware=Hardware(gpus_per_host=4, runahead=ra)), [], w)
        first[ra] = min(
            int(o["issue_ns"])
            for _, rec in w.records
            if isinstance(rec, CompletionBatch)
            for o in rec.op
            if o["rank"] == 0 and o["kind"] == OP_NAMES.index("allreduce")
        )
    assert 5e6 < first[0.0] - first[0.8] < 1e7


def test_intra_host_flows_never_touch_a_nic() -> None:
    # One 8-GPU host, TP 4 x DP 2: every flow is NVLink (a NIC fault is
    # refused outright), and wire bursts on its NICs change nothing.
    one_host = SimConfig(tp=4, pp=1, dp=2, duration_s=2.0, seed=4)
    healthy = ListWriter()
    base = simulate(one_host, [], healthy)
    with pytest.raises(ConfigError, match="between hosts"):
        simulate(one_host, [parse_spec("nic-down:rank=1,at=0.5")], ListWriter())
    bursts = dataclasses.replace(one_host, noise=Noise(wire_bursts_per_min=600))
    noisy = simulate(bursts, [], ListWriter())
    assert len(noisy.noise_events) > 5
    assert (base.iterations, base.records) == (noisy.iterations, noisy.records)
    topo = [r for _, r in healthy.records if isinstance(r, Topology)]
    transports = {
        c.transport
        for t in topo
        for rk in t.ranks
        for m in rk.comms
        for c in m.connections
    }
    assert transports == {"p2p"}
