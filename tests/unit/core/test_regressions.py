"""Regression tests for general bugs found by running the core on the simulator.

Each test names the principle it protects; none depends on simulator quirks.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import numpy as np
import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.columns import DONE_OP_COLUMNS, empty
from mycroft.schemas.records import (
    Anomaly,
    CompletionBatch,
    Culprit,
    RootCause,
    StateBatch,
)
from mycroft.schemas.vocab import OP_NAMES, RECV, SEND, Component, FaultKind
from mycroft.streams.analyze import Replay, to_json
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.collective_stat import CollectiveStat
from mycroft.streams.core.completions import matching_kind
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext, detect_mismatch
from mycroft.streams.core.detect_slow import observe_collective
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.graph import OpFlows, _data_edges
from mycroft.streams.core.incidents import Decision, Verdict, revise
from mycroft.streams.core.progress import _OP_PLUS, FLAT_FLOW, ProgressStore
from mycroft.streams.core.scoring import WEIGHTS
from mycroft.streams.core.topology import JobTopology

MS = 1_000_000


def test_p2p_send_and_recv_at_one_seq_agree():
    """The two sides of a P2P transfer (send / recv) are one op, not a mismatch."""
    kinds = np.array([OP_NAMES.index("send"), OP_NAMES.index("recv")], np.uint8)
    out = matching_kind(kinds)
    assert out[0] == out[1]
    ar = np.array([OP_NAMES.index("allreduce")], np.uint8)
    assert matching_kind(ar)[0] == ar[0]
    assert (
        matching_kind(np.array([OP_NAMES.index("allgather")], np.uint8))[0] != (out[0])
    )


def _stat(seq, begin, end, issue=None):
    n = len(begin)
    begin = np.asarray(begin, np.int64)
    return CollectiveStat(
        comm=1,
        seq=seq,
        kind=0,
        nbytes=1 << 20,
        ranks=np.arange(n, dtype=np.int32),
        issue_ns=np.asarray(issue if issue is not None else begin, np.int64),
        start_ns=begin,
        end_ns=np.asarray(end, np.int64),
        prev_issue_ns=np.full(n, -1, np.int64),
    )


def test_xfer_is_clock_offset_free_and_uses_kernel_start():
    """xfer = shortest own-clock start-to-end; CPU enqueue time is not arrival."""
    off = 7 * MS  # rank 1's host clock is 7 ms ahead
    st = _stat(
        0,
        begin=[100 * MS, 100 * MS + off],
        end=[110 * MS, 110 * MS + off],
        issue=[50 * MS, 80 * MS + off],  # CPU ran ahead by different amounts
    )
    assert st.xfer_ns == 10 * MS
    assert st.queued_span_ns > st.span_ns


def _ctx():
    cfg = DetectorConfig()
    return DetectContext(
        "j", ProgressStore(cfg.history_ns), JobTopology(), BaselineBook(64), cfg
    )


def test_one_off_stragglers_on_different_ranks_are_not_a_slowdown():
    """Arrival skew is judged per rank; independent one-off stragglers on
    different ranks of a comm must not add up to a persistent slowdown."""
    ctx = _ctx()
    rng = np.random.default_rng(0)
    fired = []
    t = 0
    for seq in range(60):
        begin = t + rng.integers(0, MS // 2, 8)
        if seq in (30, 31, 32):  # three different ranks, once each, 6 ms late
            begin[seq - 30] += 6 * MS
        end = np.full(8, begin.max() + MS // 5)
        fired += observe_collective(ctx, _stat(seq, begin, end), t)
        t += 20 * MS
    assert fired == []


def test_persistent_late_rank_fires():
    ctx = _ctx()
    rng = np.random.default_rng(1)
    fired = []
    t = 0
    for seq in range(40):
        begin = t + rng.integers(0, MS // 2, 8)
        if seq >= 20:
            begin[5] += 10 * MS
        end = np.full(8, begin.max() + MS // 5)
        fired += observe_collective(ctx, _stat(seq, begin, end), t)
        t += 20 * MS
    assert any(a.detector == "slow_late" and a.ranks == (5,) for a in fired)


def _late_on(late_seqs: set[int]) -> list:
    """60 ops of 8 ranks; rank 3 arrives 6 ms late on ``late_seqs``."""
    ctx = _ctx()
    rng = np.random.default_rng(2)
    fired, t = [], 0
    for seq in range(60):
        begin = t + rng.integers(0, MS // 2, 8)
        if seq in late_seqs:
            begin[3] += 6 * MS
        end = np.full(8, begin.max() + MS // 5)
        fired += observe_collective(ctx, _stat(seq, begin, end), t)
        t += 20 * MS
    return [a for a in fired if a.detector == "slow_late"]


def test_chance_stragglers_on_one_rank_are_not_a_slowdown():
    """Three one-off stragglers of one rank within five ops: with one
    baseline per rank and comm, a 1,024-rank job meets this by chance every
    few simulated minutes (config.late_persist)."""
    assert _late_on({30, 31, 33}) == []
    assert _late_on({30, 32, 34, 36}) == []


def test_a_rank_late_on_five_of_eight_ops_fires_on_the_fifth():
    fired = _late_on({30, 31, 33, 35, 36})
    assert fired and {a.ranks for a in fired} == {(3,)}
    assert "seq 36" in fired[0].summary


def _noisy_late_run(shift_ms: float, seed: int) -> list:
    """40 ops of 4 ranks whose arrivals jitter by up to 150 ms (a loaded
    machine); from op 20 on, rank 2 arrives ``shift_ms`` later."""
    ctx = _ctx()
    rng = np.random.default_rng(seed)
    fired, t = [], 0
    for seq in range(40):
        begin = t + rng.normal(0, 50, 4).clip(-150, 150).astype(np.int64) * MS
        if seq >= 20:
            begin[2] += int(shift_ms * MS)
        end = np.full(4, begin.max() + 5 * MS)
        fired += observe_collective(ctx, _stat(seq, begin, end), t)
        t += 1000 * MS
    return [a for a in fired if a.detector == "slow_late"]


def test_sustained_late_shift_below_the_noise_band_fires():
    """A straggler 250 ms late on arrivals that jitter by about 50 ms (sigma)
    stays below the single-sample band (median + 6 sigma) on most ops, and the
    in-band part of it is learned; the shift of the median of the last ops
    finds it (the single-sample rule alone: 3 of these 6 runs), on that rank
    only."""
    runs = [_noisy_late_run(250, seed) for seed in range(6)]
    assert sum(bool(r) for r in runs) >= 5
    assert {a.ranks for r in runs for a in r} == {(2,)}


def test_noisy_arrivals_without_a_shift_are_silent():
    assert [a for seed in range(6) for a in _noisy_late_run(0, seed)] == []


def _flows(rows):
    a = np.zeros(len(rows), FLAT_FLOW)
    width = len(FLAT_FLOW.names or ())
    for i, r in enumerate(rows):
        a[i] = tuple(r) + (0,) * (width - len(r))  # no ready-wait measured
    return a


def test_recv_whose_data_all_arrived_waits_on_itself_not_the_peer():
    """A recv flow waits on its peer only while data is still to arrive."""
    # (tick, rank, comm, seq, ch, peer, dir, total, G, T, D, last)
    fl = _flows(
        [
            (0, 1, 9, 3, 0, 0, RECV, 16, 16, 16, 4, 1),  # all arrived, not consumed
            (0, 2, 9, 3, 0, 0, RECV, 16, 8, 8, 8, 1),  # still waiting for data
            (0, 1, 9, 3, 0, 2, SEND, 16, 4, 4, 4, 1),
        ]
    )
    g = nx.DiGraph()
    _data_edges(g, OpFlows(fl), JobTopology(), 1, 9, 3)
    _data_edges(g, OpFlows(fl), JobTopology(), 2, 9, 3)
    assert not g.has_edge(1, 0)
    assert g.has_edge(2, 0)


def _sim(fault: str, seed: int, duration: float = 14.0, shape=(4, 2, 2)):
    tp, pp, dp = shape
    cfg = SimConfig(tp=tp, pp=pp, dp=dp, duration_s=duration, seed=seed)
    rp = Replay()
    res = simulate(cfg, [parse_spec(fault)] if fault else [], rp)
    a, c = rp.finish()
    return res.truth(), to_json(a, c, rp.first_resolved_ns)


def test_sim_healthy_pipeline_is_silent():
    """PP send/recv pairs, fwd/bwd phases and stragglers: no anomaly at all."""
    _, doc = _sim("", 3, duration=10.0)
    assert doc["anomalies"] == []
    assert doc["root_causes"] == []


@pytest.mark.parametrize(
    ("fault", "component"),
    [("host-stall", Component.HOST), ("gpu-hang", Component.GPU)],
)
def test_sim_hang_culprit(fault, component):
    """host-stall: idle rank that stopped issuing -> host, not process;
    gpu-hang: input arrived but never consumed -> gpu on the hung rank."""
    truth, doc = _sim(f"{fault}:rank=5,at=6", 2)
    best = doc["root_causes"][0]
    assert best["rank"] in truth["faults"][0]["ranks"]
    assert best["component"] == component.value
    # The rules behind the verdict travel with it, one of them on its component.
    assert any(WEIGHTS[Rule(r)].component is component for r in best["rules"])


def test_gpu_hang_in_a_two_rank_ring_is_named_by_its_unoffered_buffers():
    """TP 2: the hung GPU and its one peer wait on each other with no chunk
    moved on any flow (both used to be named at 0.5, before that no root
    cause at all). On the same host the receive buffers are offered by the
    kernels themselves: the live peer's are, the hung GPU's are not."""
    truth, doc = _sim("gpu-hang:rank=5,at=6", 2, shape=(2, 2, 2))
    best = doc["root_causes"][0]
    assert (best["rank"], best["component"]) == (5, Component.GPU.value)
    assert best["rules"] == ["no_buffer_offered"]
    assert best["confidence"] > 0.9
    assert truth["faults"][0]["rank"] == 5


def test_a_receiver_late_after_waiting_on_a_stalled_sender_is_not_the_culprit():
    """A send proxy stall freezes rank 54's ready sends to rank 22 (another
    host) for most of a second; 22, already at the op, is late in its other
    groups afterwards. That lateness is waiting: the sender's proxy is the
    culprit, not 22's GPU (which was named first, at 0.91)."""
    truth, doc = _sim("proxy-delay", 8, duration=16.0, shape=(8, 2, 4))
    best = doc["root_causes"][0]
    assert best["rank"] in truth["faults"][0]["ranks"]
    assert best["component"] == Component.PROXY.value


def test_a_capped_answer_confirmed_is_published_again_and_then_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An early answer capped for thin evidence, then named again at full
    confidence, is republished confirmed; after that an equally confident
    different answer does not flip it, while before it would have."""
    answers = iter(
        [
            Culprit(6, "h1", Component.GPU, FaultKind.SLOWDOWN, 0.6),
            Culprit(6, "h1", Component.GPU, FaultKind.SLOWDOWN, 0.6),
            Culprit(6, "h1", Component.GPU, FaultKind.SLOWDOWN, 0.99),
            Culprit(9, "h2", Component.NETWORK, FaultKind.SLOWDOWN, 0.99),
        ]
    )
    an = Analyzer("j")
    monkeypatch.setattr(an, "explain", lambda *_: ([next(answers)], []))
    slow = Anomaly("a", "j", FaultKind.SLOWDOWN, (1,), (6,), 0, 0, "late", "")
    published = [
        (f.revision, f.culprits[0].rank, f.culprits[0].confidence)
        for t in range(4)
        for f in an.track([slow] if t == 0 else [], t * 1_000_000_000)
        if isinstance(f, RootCause)
    ]
    assert published == [(0, 6, 0.6), (1, 6, 0.99)]


def test_a_capped_answer_is_not_flipped_by_one_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A different, equally capped answer replaces a capped one that is no
    longer named only when two rounds in a row propose it."""
    gpu = Culprit(6, "h1", Component.GPU, FaultKind.SLOWDOWN, 0.6)
    host = Culprit(0, "h0", Component.GPU, FaultKind.SLOWDOWN, 0.6)
    answers = iter([gpu, host, gpu, host, host])
    an = Analyzer("j")
    monkeypatch.setattr(an, "explain", lambda *_: ([next(answers)], []))
    slow = Anomaly("a", "j", FaultKind.SLOWDOWN, (1,), (6,), 0, 0, "late", "")
    published = [
        (f.revision, f.culprits[0].rank, t)
        for t in range(5)
        for f in an.track([slow] if t == 0 else [], t * 1_000_000_000)
        if isinstance(f, RootCause)
    ]
    assert published == [(0, 6, 0), (1, 0, 4)]


def test_a_hang_publishes_few_anomalies_and_still_finds_the_culprit():
    """A hang stalls every comm of the job; only the first
    ``incident_max_anomalies`` anomalies are published, all of them count."""
    cfg = SimConfig(tp=4, pp=2, dp=2, duration_s=14.0, seed=2)
    wide, narrow = Replay(), Replay(DetectorConfig(incident_max_anomalies=2))
    for rp in (wide, narrow):
        simulate(cfg, [parse_spec("gpu-hang:rank=5,at=6")], rp)
        rp.finish()
    assert len(wide.anomalies) > 2
    assert len(narrow.anomalies) == 2
    best = {
        rp: max(rp.causes.values(), key=lambda c: c.revision).culprits[0]
        for rp in (wide, narrow)
    }
    assert best[narrow].rank == best[wide].rank == 5
    (cause,) = narrow.causes.values()
    assert set(cause.anomaly_ids) == {a.anomaly_id for a in narrow.anomalies}


def _revises(culprits: list[Culprit], published: Verdict, *, again: bool) -> bool:
    """Whether another answer of the published kind replaces it."""
    proposed = Verdict(published.kind, tuple(culprits))
    return revise(published, proposed, again=again) is not Decision.KEEP


def test_an_answer_no_longer_named_is_revised_at_any_confidence():
    """A capped early verdict (a host 6 ms late) must not stand once its
    evidence is gone and another answer (a host 100 ms late, capped too, or
    split below the cap) replaces it two rounds in a row; while it is still
    named, only a more confident answer revises it."""
    old = Culprit(943, "h117", Component.GPU, FaultKind.SLOWDOWN, 0.6)
    new = Culprit(451, "h56", Component.GPU, FaultKind.SLOWDOWN, 0.6)
    weaker = Culprit(451, "h56", Component.GPU, FaultKind.SLOWDOWN, 0.5)
    stronger = Culprit(451, "h56", Component.GPU, FaultKind.SLOWDOWN, 0.7)
    published = Verdict(FaultKind.SLOWDOWN, (old,))
    assert _revises([new], published, again=True)
    assert not _revises([new], published, again=False)  # one round only: a flicker
    assert not _revises([new, old], published, again=True)
    assert _revises([weaker], published, again=True)  # the cap is a bound
    assert not _revises([weaker, old], published, again=True)
    assert _revises([stronger, old], published, again=False)
    # An uncapped answer (a lost rank: process, 0.99) is not flipped at equal
    # confidence by a partial view that no longer sees the rank lost.
    lost = Culprit(33, "h4", Component.PROCESS, FaultKind.HANG, 0.99)
    published = Verdict(FaultKind.HANG, (lost,))
    host = Culprit(33, "h4", Component.HOST, FaultKind.HANG, 0.99)
    assert not _revises([host], published, again=True)
    assert _revises([replace(host, confidence=1.0)], published, again=False)


def test_a_tie_is_revised_when_more_flows_single_out_its_runner_up():
    """Flows of one sending GPU into one receiving GPU name both ends, the
    sender's proxy first (a 1,024-rank pcie-downgrade). Once flows from a
    second NIC single out the receiver, its PCIe leads alone and revises the
    tie, though among a thousand ranks' small timing suspects its share of
    the score is lower than the tie's was; not while the sender is still
    named, nor for one round only, nor in a hang."""
    tie = (
        Culprit(859, "node0107", Component.PROXY, FaultKind.SLOWDOWN, 0.556, 867, 0),
        Culprit(867, "node0108", Component.PCIE, FaultKind.SLOWDOWN, 0.444),
    )
    published = Verdict(FaultKind.SLOWDOWN, tie)
    pcie = Culprit(867, "node0108", Component.PCIE, FaultKind.SLOWDOWN, 0.283)
    noise = Culprit(96, "node0012", Component.GPU, FaultKind.SLOWDOWN, 0.093)
    proxy = Culprit(859, "node0107", Component.PROXY, FaultKind.SLOWDOWN, 0.2)
    assert _revises([pcie, noise], published, again=True)
    assert not _revises([pcie, noise], published, again=False)
    assert not _revises([pcie, noise, proxy], published, again=True)
    assert not _revises([noise, pcie], published, again=True)
    # Another component of the runner-up's rank is not the runner-up; below
    # half the published top nothing else revises it either...
    gpu = replace(pcie, component=Component.GPU, confidence=0.2)
    assert not _revises([gpu], published, again=True)
    # ...at half of it or more, the published sender is gone and the answer
    # below the cap was a bound: the new leader revises it.
    assert _revises([replace(gpu, confidence=0.283)], published, again=True)
    published = Verdict(FaultKind.HANG, tie)
    hang = [replace(c, kind=FaultKind.HANG) for c in (pcie, noise)]
    assert not _revises(hang, published, again=True)


def test_a_slow_gpu_is_named_when_evaluated_seconds_after_its_onset():
    """A lagging worker evaluates seldom. 1.3 s after a power cap on rank 33,
    its few ms per op have added up to its whole host (and pipeline replica)
    arriving ~140 ms late at the data-parallel sync, far above its own
    lateness; the GPU that starts last inside its host is still the culprit
    (no root cause at all was published before)."""
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=14.0, seed=1)
    rp = Replay(cadence_ns=2_000_000_000)
    res = simulate(cfg, [parse_spec("gpu-power-cap")], rp)
    doc = to_json(*rp.finish(), rp.first_resolved_ns)
    fault = res.truth()["faults"][0]
    best = doc["root_causes"][0]
    assert (best["rank"], best["component"]) == (fault["rank"], "gpu")


def test_a_rank_in_flight_with_another_size_than_its_peers_completed_is_a_mismatch():
    """Ranks that completed an op at one size and a rank still in it at another
    disagree: the completions of a partial op count with the in-flight rows."""
    allreduce = OP_NAMES.index("allreduce")
    an = Analyzer("j")
    ops = np.zeros(1, dtype=_OP_PLUS)
    ops[["rank", "comm", "seq", "kind", "bytes"]] = (3, 7, 5, allreduce, 2 << 20)
    an.ctx.store.host("h1").ops = ops
    done = empty(DONE_OP_COLUMNS, 3)
    done["rank"], done["comm"], done["seq"] = [0, 1, 2], 7, 5
    done["kind"], done["bytes"] = allreduce, 1 << 20
    found = detect_mismatch(an.ctx, 0, done)
    assert [(a.ranks, a.comms, a.kind) for a in found] == [
        ((3,), (7,), FaultKind.MISMATCH)
    ]
    done["bytes"] = 2 << 20
    assert detect_mismatch(an.ctx, 0, done) == []


def test_a_receiver_is_not_blamed_while_the_frozen_senders_completions_lag():
    """Hosts report in any order. A send proxy that froze delays its own
    host's completions most, so when the slowdown fires the frozen transfer
    may not be joined yet while the receiver's late arrival elsewhere is:
    the receiver waited (its receive flow was in flight before the freeze),
    and the sender's frozen flow names the culprit."""
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=20.0, seed=7, job_id="lag")
    out = ListWriter()
    (fault,) = simulate(cfg, [parse_spec("proxy-delay")], out).faults
    host = next(
        r.header.host
        for _, r in out.records
        if isinstance(r, StateBatch) and fault.rank in r.rc["rank"]
    )
    late = [
        (
            ts
            + (
                500 * MS
                if isinstance(r, CompletionBatch) and r.header.host == host
                else 0
            ),
            i,
            r,
        )
        for i, (ts, r) in enumerate(out.records)
    ]
    late.sort(key=lambda x: x[:2])
    an, tick, first = Analyzer(cfg.job_id), late[0][0], None
    for ts, _, rec in late:
        while first is None and tick <= ts:
            found = [f for f in an.evaluate(tick) if isinstance(f, RootCause)]
            first = found[0] if found else None
            tick += 200 * MS
        an.ingest(rec, ts)
    assert first is not None
    top = first.culprits[0]
    assert (top.rank, top.component) == (fault.rank, Component.PROXY), first.culprits
