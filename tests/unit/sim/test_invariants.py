"""Invariants of healthy traces: counters, agreement, ring order, determinism."""

from __future__ import annotations

import numpy as np

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.tracefile import TraceFileWriter, read_records
from mycroft.schemas.records import CompletionBatch, StateBatch
from mycroft.schemas.vocab import OP_NAMES
from tests.unit.sim.trace import SEND, T0_NS, cached, run, small_config, stuck_flows


def _flow_key(fl: dict[str, np.ndarray]) -> np.ndarray:
    return np.stack(
        [
            fl["rank"],
            fl["comm"].view(np.int64),
            fl["seq"],
            fl["channel"],
            fl["peer"],
            fl["dir"],
        ],
        axis=1,
    )


def test_counters_ordered_and_bounded() -> None:
    fl = cached().flow
    assert len(fl["total"]) > 1000
    assert (fl["total"] >= fl["gpu_ready"]).all()
    assert (fl["gpu_ready"] >= fl["transmitted"]).all()
    assert (fl["transmitted"] >= fl["done"]).all()
    assert (fl["done"] >= 0).all()
    assert (fl["done"] > 0).any() and (fl["done"] < fl["total"]).any()


def test_counters_monotone_across_ticks() -> None:
    fl = run(small_config(1.5, interval_ms=10)).flow
    key = _flow_key(fl)
    order = np.lexsort((fl["tick"], *key.T[::-1]))
    same = (key[order][1:] == key[order][:-1]).all(axis=1)
    assert same.sum() > 100, "some flows must be sampled on several ticks"
    for name in ("gpu_ready", "transmitted", "done", "last_ns"):
        v = fl[name][order]
        assert (v[1:][same] >= v[:-1][same]).all(), name


def test_last_ns_is_not_in_the_future() -> None:
    tr = cached()
    fl = tr.flow
    tick_ns = T0_NS + fl["tick"] * 100_000_000
    moved = fl["gpu_ready"] > 0
    assert (fl["last_ns"][moved] > 0).all()
    assert (fl["last_ns"][moved] <= tick_ns[moved] + 10_000_000).all()
    assert (fl["last_ns"][~moved] == 0).all()


def test_all_ranks_of_a_comm_agree_in_healthy_run() -> None:
    tr = cached()
    d = tr.done
    key = np.stack([d["comm"].view(np.int64), d["seq"]], axis=1)
    _, inv, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    inv = inv.ravel()
    sizes = {
        m.comm: m.nranks for t in tr.topologies() for r in t.ranks for m in r.comms
    }
    p2p = [OP_NAMES.index("send"), OP_NAMES.index("recv")]
    for g in np.flatnonzero(counts > 1)[:400]:
        rows = np.flatnonzero(inv == g)
        assert len(np.unique(d["bytes"][rows])) == 1
        kinds = set(d["kind"][rows].tolist())
        assert len(kinds) == 1 or kinds == set(p2p)
        assert len(rows) <= sizes[int(d["comm"][rows[0]])]
    complete = counts[inv] == np.array([sizes[int(c)] for c in d["comm"]])
    assert complete.mean() > 0.95


def test_every_rank_issues_ops_in_sequence() -> None:
    rc = cached().rc
    assert (rc["issued_seq"] >= rc["done_seq"]).all()
    assert (rc["issued_seq"] - rc["done_seq"] <= 2).all()
    key = np.stack([rc["rank"], rc["comm"].view(np.int64)], axis=1)
    order = np.lexsort((rc["tick"], key[:, 1], key[:, 0]))
    same = (key[order][1:] == key[order][:-1]).all(axis=1)
    for name in ("issued_seq", "done_seq", "seen_ns"):
        v = rc[name][order]
        assert (v[1:][same] >= v[:-1][same]).all(), name


def test_ring_send_never_runs_ahead_of_what_was_received() -> None:
    tr = cached()
    fl = tr.flow
    ring = tr.of_kind(fl, "allreduce", "reducescatter", "allgather")
    sizes = {
        m.comm: m.nranks for t in tr.topologies() for r in t.ranks for m in r.comms
    }
    key = np.stack([fl["op"], fl["channel"]], axis=1)
    send = ring & (fl["dir"] == SEND)
    recv_of = {tuple(k): i for i, k in enumerate(key) if not send[i] and ring[i]}
    checked = 0
    for i in np.flatnonzero(send):
        j = recv_of[tuple(key[i])]
        n = sizes[int(fl["comm"][i])]
        steps = 2 * (n - 1) if fl["kind"][i] == OP_NAMES.index("allreduce") else n - 1
        per_step = fl["total"][i] // steps
        assert fl["transmitted"][i] <= fl["transmitted"][j] + per_step
        checked += int(fl["transmitted"][i] > per_step)
    assert checked > 50


def test_healthy_run_has_no_stuck_flows_and_keeps_completing() -> None:
    tr = cached()
    assert not stuck_flows(tr, 5).any()
    last_end_s = (tr.done["end_ns"].max() - T0_NS) / 1e9
    assert last_end_s > tr.result.config.duration_s - 0.2


def test_healthy_run_has_bubbles_and_jitter() -> None:
    tr = cached()
    op = tr.op
    waiting_recv = tr.of_kind(op, "recv") & (op["start_ns"] == 0)
    assert waiting_recv.sum() > 20
    d = tr.done
    rs = tr.of_kind(d, "reducescatter")
    dur = (d["end_ns"] - d["start_ns"])[rs]
    assert dur.std() / dur.mean() > 0.01


def test_one_state_batch_per_host_per_tick_and_heartbeats() -> None:
    tr = cached()
    cfg = tr.result.config
    states = [r for _, r in tr.records if isinstance(r, StateBatch)]
    ticks = round(cfg.duration_s * 1000) // cfg.interval_ms
    assert len(states) == ticks * cfg.hosts
    assert {s.header.agent_seq for s in states} == set(range(1, ticks + 1))
    assert all(len(s.rc) == 8 * 3 for s in states)
    assert len(tr.heartbeats()) == int(cfg.duration_s) * cfg.hosts
    assert len(tr.topologies()) == cfg.hosts
    comps = [r for _, r in tr.records if isinstance(r, CompletionBatch)]
    assert all(len(c.op) > 0 for c in comps)


def test_host_clocks_are_offset() -> None:
    tr = cached()
    offsets = np.array(tr.result.offsets_s)
    assert np.abs(offsets).max() > 1e-4
    assert np.abs(offsets).max() < 0.02


def test_same_seed_same_bytes_other_seed_differs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    def write(seed: int, name: str) -> bytes:
        path = tmp_path / name
        with TraceFileWriter(path) as w:
            simulate(small_config(1.0, seed), [], w)
        return path.read_bytes()

    a, b, c = write(3, "a"), write(3, "b"), write(4, "c")
    assert a == b
    assert a != c


def test_trace_file_replays_with_read_records(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.trace.gz"
    with TraceFileWriter(path) as w:
        result = simulate(small_config(1.0), [], w)
    records = list(read_records(path))
    assert len(records) == result.records
    times = [ts for ts, _ in records]
    assert times == sorted(times)
    assert any(isinstance(r, StateBatch) and len(r.flow) for _, r in records)


def test_runs_without_pipeline_or_data_parallel() -> None:
    tr = run(SimConfig(tp=4, pp=1, dp=2, duration_s=0.5))
    assert tr.result.config.hosts == 1
    assert len(tr.done["rank"]) > 0
