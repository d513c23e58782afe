"""The hot paths of the core against plain reference implementations.

Completion ingest, baselines, flow-gap lookup and the hang check are written
for speed (sorted windows, grouped rows, per-snapshot indexes, reductions);
each must give exactly what the obvious code gives.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.columns import DONE_OP_COLUMNS, empty
from mycroft.schemas.records import BatchHeader, CompletionBatch
from mycroft.schemas.vocab import OP_NAMES, SEND
from mycroft.streams.analyze import Replay
from mycroft.streams.core.baseline import RobustBaseline, _median, _median_abs_dev
from mycroft.streams.core.collective_stat import CollectiveStat, Members, small_median
from mycroft.streams.core.completions import (
    CompletionTracker,
    RecentStats,
    matching_kind,
)
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import (
    DetectContext,
    _silence_limit_ns,
    comm_last_progress,
    lost_ranks,
)
from mycroft.streams.core.detect_slow import GAP_CLOCK_SLACK_NS, op_flow_gaps
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.flow_features import (
    CLOCK_SKEW_NS,
    FREEZE_NS,
    FlowFeatures,
    flow_features,
)
from mycroft.streams.core.progress import FLAT_FLOW, ProgressStore
from mycroft.streams.core.rca_hosts import _intra_host_slowdown
from mycroft.streams.core.rca_timing import PAIR_ROW, Lateness, late_scores
from mycroft.streams.core.rows import group_ids, group_medians
from mycroft.streams.core.topology import JobTopology
from tests.unit import samples
from tests.unit.core.snapshot_roundtrip import roundtrip

MS = 1_000_000


def _mad_reference(values: list[float]) -> float:
    med = float(np.median(values))
    return float(np.median(np.abs(np.asarray(values) - med)))


@pytest.mark.parametrize("seed", range(5))
def test_mad_selected_from_the_sorted_window_is_the_sorted_mad(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        n = rng.randint(1, 70)
        draw = rng.choice(
            [rng.random, lambda: float(rng.randint(0, 4)), lambda: rng.gauss(0, 1e6)]
        )
        ordered = sorted(draw() for _ in range(n))
        med = _median(ordered)
        assert med == float(np.median(ordered))
        assert _median_abs_dev(ordered, med) == _mad_reference(ordered)
    assert _median_abs_dev([], 0.0) == 0.0


def test_baseline_window_stays_sorted_through_learning_and_eviction() -> None:
    cfg = DetectorConfig()
    base = RobustBaseline(window=16)
    rng = random.Random(3)
    for i in range(300):
        value = rng.gauss(100.0, 5.0) if i % 37 else 1e4  # some out-of-band spikes
        base.observe(value, cfg, 1.0)
        assert base.ordered == sorted(base.values)
        assert len(base.values) <= 16
        if base.values:
            med, sigma = base.stats()
            assert med == float(np.median(list(base.values)))
            assert sigma == pytest.approx(1.4826 * _mad_reference(list(base.values)))
    assert 1e4 not in base.values  # spikes were judged, not learned


@pytest.mark.parametrize("n", [1, 2, 3, 8, 33])
def test_small_median_is_numpys(n: int) -> None:
    rng = np.random.default_rng(n)
    ints = rng.integers(1 << 60, (1 << 60) + 10**9, n, dtype=np.int64)
    floats = rng.normal(0, 1e6, n)
    assert small_median(ints) == float(np.median(ints))
    assert small_median(floats) == float(np.median(floats))


def _batch(rows: list[tuple[int, int, int, int, int, int]]) -> CompletionBatch:
    """(rank, comm, seq, kind, bytes, end_ns) rows -> one host's batch."""
    op = empty(DONE_OP_COLUMNS, len(rows))
    for i, (rank, comm, seq, kind, nbytes, end) in enumerate(rows):
        op[i] = (rank, comm, seq, kind, nbytes, end - 5 * MS, end - 3 * MS, end, 0)
    header = BatchHeader("j", "h", 1, 0, 0, 100)
    return CompletionBatch(header, op)


def _deliveries(
    rng: random.Random, members: dict[int, list[int]]
) -> Iterator[list[tuple[int, int, int, int, int, int]]]:
    """Every member's completion of 6 ops per comm, shuffled, in random small
    batches. In the first comm, the first rank to report op 2 reports it
    again right away (the copy must be ignored) and one rank reports op 4
    with another size (a mismatch)."""
    allreduce, send, recv = (OP_NAMES.index(k) for k in ("allreduce", "send", "recv"))
    rows = []
    for comm, ranks in members.items():
        for seq in range(6):
            for i, r in enumerate(ranks):
                kind = allreduce if len(ranks) > 2 else (send, recv)[i]
                nbytes = 1 << (
                    21 if (comm, seq, i) == (next(iter(members)), 4, 1) else 20
                )
                rows.append((r, comm, seq, kind, nbytes, (seq + 1) * 100 * MS + r * MS))
    rng.shuffle(rows)
    first = next(iter(members))
    at = next(i for i, row in enumerate(rows) if row[1:3] == (first, 2))
    rows.insert(at + 1, (*rows[at][:5], 999 * MS))
    while rows:
        k = rng.randint(1, 7)
        yield rows[:k]
        rows = rows[k:]


def test_tracker_drops_the_oldest_partial_collectives_over_its_row_cap() -> None:
    """Without communicator sizes nothing joins: the tracker keeps at most
    ``max_rows`` partial rows, the newest collectives, besides the timeout."""
    tracker = CompletionTracker()
    for seq in range(10):  # two ranks report each op, one batch per op
        pair = [(0, 5, seq, 0, 64, MS), (1, 5, seq, 0, 64, MS)]
        tracker.ingest(_batch(pair), {}, seq)
    tracker.join({})
    tracker.expire(now_ns=9, timeout_ns=10**9, max_rows=7)
    assert sorted(set(tracker.signature_rows()["seq"].tolist())) == [7, 8, 9]
    tracker.expire(now_ns=10**9 + 8, timeout_ns=10**9)  # 7 arrived over 1 s ago
    assert sorted(set(tracker.signature_rows()["seq"].tolist())) == [8, 9]


def test_tracker_joins_each_collective_once_as_the_naive_join_does() -> None:
    # Comm hashes above 2^63 check the unsigned grouping order too.
    members = {(1 << 63) + 5: [0, 1, 2, 3, 4, 5, 6, 7], 17: [3, 11], 9: [0, 8, 16, 24]}
    sizes = {c: len(r) for c, r in members.items()}
    tracker = CompletionTracker()
    seen: dict[tuple[int, int], dict[int, tuple[int, int, int, int]]] = {}
    got: list[CollectiveStat] = []
    prev_issue: dict[tuple[int, int], int] = {}  # (comm, rank) -> last issue
    want_prev: dict[tuple[int, int], list[int]] = {}
    for batch_rows in _deliveries(random.Random(7), members):
        expected_keys = []
        for rank, comm, seq, kind, nbytes, end in batch_rows:
            per = seen.setdefault((comm, seq), {})
            done_before = len(per) == sizes[comm]
            per.setdefault(rank, (kind, nbytes, end, rank))
            if len(per) == sizes[comm] and not done_before:
                expected_keys.append((comm, seq))
        out = tracker.ingest(_batch(batch_rows), sizes, 0)
        assert [(s.comm, s.seq) for s in out] == sorted(set(expected_keys))
        for comm, seq in sorted(set(expected_keys)):  # in completion order
            per = seen[(comm, seq)]
            want_prev[(comm, seq)] = [
                prev_issue.get((comm, r), -1) for r in sorted(per)
            ]
            for r in per:
                prev_issue[(comm, r)] = per[r][2] - 5 * MS
        got.extend(out)
    assert len(got) == 18
    for st in got:
        first = seen[(st.comm, st.seq)]
        assert st.ranks.tolist() == sorted(members[st.comm])
        assert st.end_ns.tolist() == [first[r][2] for r in sorted(first)]
        assert st.issue_ns.tolist() == [first[r][2] - 5 * MS for r in sorted(first)]
        assert st.start_ns.tolist() == [first[r][2] - 3 * MS for r in sorted(first)]
        assert st.prev_issue_ns.tolist() == want_prev[(st.comm, st.seq)]
        assert st.nbytes == int(np.median([first[r][1] for r in first]))
        kinds = matching_kind(np.array([first[r][0] for r in first], np.uint8))
        assert st.kind == int(np.bincount(kinds).argmax())
    # Nothing is partial; the one op completed in disagreement is kept.
    odd = tracker.signature_rows()
    assert set(zip(odd["comm"].tolist(), odd["seq"].tolist(), strict=True)) == {
        (next(iter(members)), 4)
    }
    assert sorted(Counter(odd["bytes"].tolist()).values()) == [1, 7]
    assert len(set(odd["rank"].tolist())) == len(odd)


@pytest.fixture(scope="module")
def fed() -> Analyzer:
    """A 64-rank analyzer fed 8 s of a NIC slowdown (flows with real gaps)."""
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=8.0, seed=4, job_id="fast")
    replay = Replay()
    simulate(cfg, [parse_spec("nic-bandwidth:rank=9,at=3,severity=0.7")], replay)
    return replay.analyzers["fast"]


def _last_progress_reference(store: ProgressStore) -> dict[int, tuple[int, int, bool]]:
    s, ops = store.slots, store.in_flight_ops()
    host_tick = store.host_tick_of_slots()
    prog = np.maximum(s["issued_change_ns"], s["done_change_ns"])
    out = {}
    for comm in sorted(set(s["comm"].tolist())):
        m = s["comm"] == comm
        last = int(prog[m].max())
        in_op = ops["comm"] == comm
        if in_op.any():
            last = max(last, int(ops["prog_ns"][in_op].max()))
        busy = bool((s["issued"][m] > s["done"][m]).any()) or bool(
            (s["done"][m] < s["issued"][m].max()).any()
        )
        out[comm] = (last, int(host_tick[m].max()), busy)
    return out


def test_comm_progress_reductions_match_a_mask_per_comm(fed: Analyzer) -> None:
    store = fed.ctx.store
    assert len(store.in_flight_ops())
    assert comm_last_progress(store) == _last_progress_reference(store)


def _gaps_reference(
    fed: Analyzer, st: CollectiveStat
) -> dict[int, tuple[float, float]]:
    topo, store = fed.ctx.topo, fed.ctx.store
    hosts = {topo.host_of(r) for r in st.ranks.tolist()}
    if len(hosts) < 2:
        return {}
    cutoff = int(st.issue_ns.min()) - GAP_CLOCK_SLACK_NS
    parts = [
        snap[(snap["comm"] == st.comm) & (snap["seq"] == st.seq)]
        for h in hosts
        for snap in fed.ctx.store.hosts[h].history
        if int(snap["tick_ns"][0]) >= cutoff
    ]
    every = np.concatenate(parts)
    rows = every[
        (every["dir"] == SEND)
        & (every["gpu_ready"] > 0)
        & (every["done"] < every["total"])
    ]
    out = {}
    for rank in sorted(set(rows["rank"].tolist())):
        f = rows[rows["rank"] == rank]
        f = f[[topo.host_of(p) != topo.host_of(rank) for p in f["peer"].tolist()]]
        if len(f):
            reports = [
                store.hosts[topo.host_of(int(x["peer"]))].reports_recv for x in f
            ]
            seen = [_seen_at(every, x, r) for x, r in zip(f, reports, strict=True)]
            gt = [
                max(min(float(x["gpu_ready"]), posted) - sent, 0.0)
                for x, (sent, posted) in zip(f, seen, strict=True)
            ]
            out[rank] = (
                float(np.median(gt)),
                float(np.median(f["transmitted"] - f["done"])),
            )
    return out


def test_flow_gaps_from_the_send_index_match_a_snapshot_scan(fed: Analyzer) -> None:
    oldest = min(int(h.history[0]["tick_ns"][0]) for h in fed.ctx.store.hosts.values())
    stats = [
        s for s in fed.stats if int(s.issue_ns.min()) - GAP_CLOCK_SLACK_NS > oldest
    ]
    found = 0
    for st in stats:
        fast = op_flow_gaps(fed.ctx, st)
        assert fast == _gaps_reference(fed, st), (st.comm, st.seq)
        found += bool(fast)
    assert found >= 10  # the comparison covered ops caught in flight


def test_baseline_and_collective_survive_a_snapshot_round_trip(fed: Analyzer) -> None:
    cfg = DetectorConfig()
    base = RobustBaseline(window=8)
    for v in (5.0, 7.0, 6.0, 6.5, 90.0, 6.2, 5.9, 6.1, 6.3, 6.0):
        base.observe(v, cfg, 0.5, shift=True)
    back = roundtrip(base)
    assert (list(back.values), back.ordered) == (list(base.values), base.ordered)
    assert (list(back.recent), list(back.last), back.shift) == (
        list(base.recent),
        list(base.last),
        base.shift,
    )
    assert back.stats() == base.stats()
    assert back.observe(30.0, cfg, 0.5) == base.observe(30.0, cfg, 0.5)
    st = list(fed.stats)[-1]
    _ = st.begin_ns  # a cached property is not part of the snapshot
    copy = roundtrip(st)
    assert copy._begin is None  # noqa: SLF001 - the cache, not the data
    assert (copy.comm, copy.seq, copy.kind, copy.nbytes) == (
        st.comm,
        st.seq,
        st.kind,
        st.nbytes,
    )
    assert (copy.first_issue_ns, copy.last_end_ns, copy.span_ns) == (
        st.first_issue_ns,
        st.last_end_ns,
        st.span_ns,
    )
    for name in ("ranks", "issue_ns", "start_ns", "end_ns", "prev_issue_ns"):
        assert getattr(copy, name).dtype == getattr(st, name).dtype
        assert getattr(copy, name).tolist() == getattr(st, name).tolist()
    assert copy.lateness_ns().tolist() == st.lateness_ns().tolist()


def _op(comm: int, seq: int, end_ms: int) -> CollectiveStat:
    t = np.full(2, end_ms * MS, np.int64)
    return CollectiveStat(
        comm, seq, 0, 1, np.array([0, 1], np.int32), t - MS, t - MS, t, t - 2 * MS
    )


def test_a_busy_comm_does_not_flush_the_others_recent_ops() -> None:
    recent = RecentStats(per_comm=4)
    recent.append(_op(1, 0, 10))  # a slow data-parallel op
    for seq in range(1000):  # a flood of point-to-point ops
        recent.append(_op(2, seq, 11 + seq))
    assert len(recent) == 5
    assert [(s.comm, s.seq) for s in recent.since(0)] == [(1, 0)] + [
        (2, s) for s in range(996, 1000)
    ]
    assert [s.seq for s in recent.since(1009 * MS)] == [998, 999]
    assert len(recent) == 5


def test_since_orders_by_completion_then_unsigned_comm_then_seq() -> None:
    big = (1 << 64) - 5  # comm ids are unsigned 64-bit hashes
    recent = RecentStats(per_comm=8)
    for op in [_op(big, 3, 12), _op(7, 9, 12), _op(big, 2, 12), _op(7, 1, 30)]:
        recent.append(op)
    recent.append(_op(1 << 40, 0, 5))
    recent.append(_op(7, 4, 12))
    expected = sorted(recent.since(0), key=lambda s: (s.last_end_ns, s.comm, s.seq))
    assert [(s.comm, s.seq) for s in recent.since(0)] == [
        (s.comm, s.seq) for s in expected
    ]
    assert [(s.comm, s.seq) for s in recent.since(12 * MS)] == [
        (7, 4), (7, 9), (big, 2), (big, 3), (7, 1)
    ]  # fmt: skip
    assert recent.since(31 * MS) == []
    assert RecentStats().since(0) == []


def test_extend_keeps_what_appending_one_by_one_keeps() -> None:
    ops = [_op(1 + seq % 3, seq, 10 + seq) for seq in range(40)]
    one, block = RecentStats(per_comm=5), RecentStats(per_comm=5)
    for op in ops:
        one.append(op)
    block.extend(ops[:17])
    block.extend(ops[17:])
    assert [(s.comm, s.seq) for s in block] == [(s.comm, s.seq) for s in one]
    assert len(block) == 15


def _late_scores_reference(ctx: DetectContext, stats: list[CollectiveStat]) -> Lateness:
    late: dict[int, list[float]] = {}
    endl: dict[int, list[float]] = {}
    per_comm: dict[tuple[int, int], list[float]] = {}
    waits: dict[int, float] = {}
    for st in stats:
        lt, el = st.lateness_ns(), st.end_lag_ns()
        cut = max(0.3 * max(float(st.span_ns), 1.0), ctx.cfg.late_floor_s * 1e9)
        for r, lv, ev in zip(st.ranks.tolist(), lt.tolist(), el.tolist(), strict=True):
            base = ctx.book.find((st.comm, r, "late"))
            ref = base.stats()[0] if base is not None and base.warm else 0.0
            late.setdefault(r, []).append(lv - ref)
            per_comm.setdefault((st.comm, r), []).append(lv - ref)
            endl.setdefault(r, []).append(ev)
            if lv - ref < -cut:
                waits[r] = max(waits.get(r, 0.0), float(lt.max()) - lv)
    worst: dict[int, float] = {}
    for (_, r), v in per_comm.items():
        worst[r] = max(worst.get(r, float(np.median(v))), float(np.median(v)))
    pairs = np.array(
        [(c, r, float(np.median(v))) for (c, r), v in sorted(per_comm.items())],
        PAIR_ROW,
    )
    return Lateness(
        {r: float(np.median(v)) for r, v in late.items()},
        {r: float(np.median(v)) for r, v in endl.items()},
        waits,
        worst,
        {r: len(v) for r, v in late.items()},
        pairs,
    )


def test_lateness_scores_over_op_matrices_match_the_per_op_loop(fed: Analyzer) -> None:
    stats = list(fed.stats)
    assert len({len(s.ranks) for s in stats}) >= 2  # several op sizes
    fast = late_scores(fed.ctx, stats)
    slow = _late_scores_reference(fed.ctx, stats)
    for got, want in zip(fast[:-1], slow[:-1], strict=True):
        assert got == want
        assert list(got) == list(want)  # same order (ties resolve the same way)
    for name in PAIR_ROW.names:
        assert np.array_equal(fast.pairs[name], slow.pairs[name])
    assert any(v != 0.0 for v in fast[0].values())  # real lateness was compared
    empty = late_scores(fed.ctx, [])
    assert empty[:-1] == ({}, {}, {}, {}, {})
    assert not len(empty.pairs)


def _intra_host_reference(
    ctx: DetectContext, stats: list[CollectiveStat], spans: list[float]
) -> dict[str, float]:
    """One op at a time: spans per (kind, size bucket) per intra-host comm's
    host, each host's median against the median host, outliers +1."""
    per: dict[tuple[int, int], dict[str, list[float]]] = {}
    host_of_comm: dict[int, str | None] = {}
    for st, span in zip(stats, spans, strict=True):
        if st.comm not in host_of_comm:
            on = {ctx.topo.host_of(r) for r in st.ranks.tolist()}
            one = len(st.ranks) >= 2 and len(on) == 1
            host_of_comm[st.comm] = on.pop() if one else None
        host = host_of_comm[st.comm]
        if host is not None:
            key = (st.kind, int(st.nbytes).bit_length())
            per.setdefault(key, {}).setdefault(host, []).append(span)
    ratios: dict[str, list[float]] = {}
    for hosts in per.values():
        if len(hosts) >= 3:
            meds = {h: float(np.median(v)) for h, v in hosts.items()}
            ref = max(float(np.median(list(meds.values()))), 1.0)
            for h, m in meds.items():
                ratios.setdefault(h, []).append(m / ref)
    agg = {h: float(np.median(v)) for h, v in ratios.items()}
    vals = np.array(list(agg.values()))
    med = float(np.median(vals))
    cut = med + max(4 * 1.4826 * float(np.median(np.abs(vals - med))), 0.1)
    return {h: (1.0 if v > cut else -1.0) for h, v in agg.items()}


def test_intra_host_slowdown_in_columns_matches_the_per_op_loop(fed: Analyzer) -> None:
    stats = list(fed.stats)
    spans = [float(s.span_ns) for s in stats]
    assert _intra_host_slowdown(fed.ctx, Members(stats)) == _intra_host_reference(
        fed.ctx, stats, spans
    )
    # node0002's own collectives three times slower: it alone stands out.
    host = fed.ctx.topo.host_of
    slowed = [
        3 * v if {host(r) for r in s.ranks.tolist()} == {"node0002"} else v
        for s, v in zip(stats, spans, strict=True)
    ]
    got = _intra_host_slowdown(fed.ctx, Members(stats), np.array(slowed, np.int64))
    assert got == _intra_host_reference(fed.ctx, stats, slowed)
    assert [h for h, v in got.items() if v > 0] == ["node0002"]
    assert len(got) >= 4


def _flow_features_reference(hist: np.ndarray) -> list[FlowFeatures]:
    """One flow at a time, as FlowFeatures documents each statistic."""
    send = hist[hist["dir"] == SEND]
    keys = sorted(
        {
            (r, p, c, int(np.uint64(m).view(np.int64)))
            for r, p, c, m in zip(
                send["rank"].tolist(),
                send["peer"].tolist(),
                send["channel"].tolist(),
                send["comm"].tolist(),
                strict=True,
            )
        }
    )
    out = []
    for rank, peer, ch, comm in keys:
        u = int(np.int64(comm).view(np.uint64))
        f = send[
            (send["rank"] == rank)
            & (send["peer"] == peer)
            & (send["channel"] == ch)
            & (send["comm"] == u)
        ]
        f = f[np.argsort(f["tick_ns"], kind="stable")]
        tot = np.maximum(f["total"], 1).astype(np.float64)
        run = f[(f["gpu_ready"] > 0) & (f["done"] < f["total"])]
        seen = [_seen_at(hist, x) for x in run]
        wait = [
            max(float(x["gpu_ready"]) - posted, 0.0)
            for x, (_, posted) in zip(run, seen, strict=True)
        ]
        gaps = {
            "gt": [
                max(float(x["gpu_ready"]) - sent - w, 0.0)
                for x, (sent, _), w in zip(run, seen, wait, strict=True)
            ],
            "td": [float(x["transmitted"] - x["done"]) for x in run],
            "wait": wait,
        }
        worst, every = {}, {}
        for name, values in gaps.items():
            by_op: dict[int, list[float]] = {}
            for s, gap in zip(run["seq"].tolist(), values, strict=True):
                by_op.setdefault(s, []).append(gap)
            medians = [float(np.median(by_op[s])) for s in sorted(by_op)]
            worst[name] = max(medians, default=0.0)
            every[name] = tuple(medians)
        eps, longest, at, begin = 0, 0, -1, -1
        for i in range(1, len(f) + 1):
            stuck = (
                i < len(f)
                and f["seq"][i] == f["seq"][i - 1]
                and f["comm"][i] == f["comm"][i - 1]
                and f["transmitted"][i] == f["transmitted"][i - 1]
                and f["gpu_ready"][i] > f["transmitted"][i]
            )
            if stuck and begin < 0:
                begin = i - 1
            if not stuck and begin >= 0:
                dur = int(f["tick_ns"][i - 1] - f["tick_ns"][begin])
                if dur >= FREEZE_NS:
                    eps += 1
                    if dur > longest:
                        longest, at = dur, begin
                begin = -1
        out.append(
            FlowFeatures(
                rank, peer, ch, u,
                total=float(np.median(tot)),
                ready=float(np.mean(f["gpu_ready"] / tot)),
                episodes=eps,
                longest_freeze_ns=longest,
                gt_chunks=worst["gt"],
                td_chunks=worst["td"],
                started=bool(len(run)),
                freeze_seq=int(f["seq"][at]) if at >= 0 else -1,
                freeze_start_ns=int(f["tick_ns"][at]) if at >= 0 else -1,
                wait_chunks=worst["wait"],
                td_ops=every["td"],
            )
        )  # fmt: skip
    return out


def _seen_at(
    hist: np.ndarray, send: np.void, reports: bool | None = None
) -> tuple[float, float]:
    """``send``'s T and what its receiver had posted for it: G of the
    receiver's recv flow of its op and channel at its latest snapshot up to
    ``CLOCK_SKEW_NS`` after the send's, less that snapshot's T beyond the
    send's T (at least T); without one, T when the receiver reports receive
    flows (``reports``, or any in ``hist``), else inf."""
    mine = hist[(hist["dir"] != SEND) & (hist["rank"] == send["peer"])]
    recv = mine[
        (mine["peer"] == send["rank"])
        & (mine["comm"] == send["comm"])
        & (mine["channel"] == send["channel"])
        & (mine["seq"] == send["seq"])
    ]
    sent = float(send["transmitted"])
    ticks = recv["tick_ns"].astype(np.int64)
    now = ticks <= int(send["tick_ns"]) + CLOCK_SKEW_NS
    if now.any():
        at = recv[now][np.argmax(ticks[now])]
        after = max(float(at["transmitted"]) - sent, 0.0)
        return sent, max(sent, float(at["gpu_ready"]) - after)
    if reports is None:
        reports = bool(len(mine))
    return sent, sent if reports else float("inf")


def _stalling_history(seed: int) -> np.ndarray:
    """Random send snapshots of 40 flows with stalls of every length, ties
    between equal freezes, ops changing mid-stall and a comm id above 2**63."""
    rng = np.random.default_rng(seed)
    n = 3000
    rows = np.zeros(n, dtype=FLAT_FLOW)
    flow = rng.integers(0, 40, n)
    rows["rank"], rows["peer"] = flow % 8, (flow % 8 + 1 + flow // 20) % 8
    rows["channel"] = flow // 8 % 2
    rows["comm"] = np.where(flow % 3 == 0, np.uint64(2**63 + 5), np.uint64(77))
    rows["dir"] = np.where(rng.random(n) < 0.9, SEND, 1 - SEND)
    rows["tick_ns"] = rng.integers(0, 60, n) * 100 * MS
    rows["seq"] = rows["tick_ns"] // (700 * MS) + rng.integers(0, 2, n) * (
        rng.random(n) < 0.05
    )
    rows["total"] = rng.choice([0, 32, 64], n)
    rows["gpu_ready"] = rng.integers(0, 65, n)
    rows["transmitted"] = np.minimum(rows["gpu_ready"], rng.choice([3, 9, 20], n))
    rows["done"] = np.minimum(rows["transmitted"], rng.integers(0, 20, n))
    return rows


def _assert_same_features(got: list[FlowFeatures], want: list[FlowFeatures]) -> None:
    """Equal, but for ``ready``: a mean summed per flow in another order
    (``reduceat``), so the last bit may differ."""
    assert [replace(f, ready=0.0) for f in got] == [replace(f, ready=0.0) for f in want]
    assert [f.td_ops for f in got] == [f.td_ops for f in want]
    assert [f.ready for f in got] == pytest.approx([f.ready for f in want], rel=1e-12)


def test_flow_features_over_all_flows_match_the_per_flow_definitions(
    fed: Analyzer,
) -> None:
    real = fed.ctx.store.flow_history(0)
    _assert_same_features(flow_features(real), _flow_features_reference(real))
    frozen = 0
    for seed in range(4):
        hist = _stalling_history(seed)
        got = flow_features(hist)
        _assert_same_features(got, _flow_features_reference(hist))
        frozen += sum(f.episodes for f in got)
    assert frozen >= 20  # freezes, not only moving flows, were compared
    assert flow_features(real[:0]) == []


def _lost_reference(ctx: DetectContext, now_ns: int) -> dict[int, tuple[str, int]]:
    """``lost_ranks`` as one Python step per slot (the loop it replaced)."""
    store, cfg = ctx.store, ctx.cfg
    newest = max(h.last_now_ns for h in store.hosts.values())
    gaps = [h.gap_ns for h in store.hosts.values() if h.gap_ns > 0]
    median_gap = float(np.median(gaps)) if gaps else 0.0
    if now_ns - newest > _silence_limit_ns(cfg, median_gap):
        return {}
    fresh = {
        h.index
        for h in store.hosts.values()
        if newest - h.last_now_ns <= _silence_limit_ns(cfg, h.gap_ns)
    }
    hosts, s = list(store.hosts.values()), store.slots
    host_tick = store.host_tick_of_slots()
    out: dict[int, tuple[str, int]] = {}
    for i in range(len(s)):
        hs = hosts[int(s["host"][i])]
        limit = _silence_limit_ns(cfg, hs.gap_ns)
        rank, tick, seen = int(s["rank"][i]), int(s["tick_ns"][i]), int(s["seen_ns"][i])
        if hs.index not in fresh:
            out[rank] = ("host", tick)
        elif host_tick[i] - tick > limit:
            out.setdefault(rank, ("rows", tick))
        elif seen > 0 and tick - seen > limit:
            out.setdefault(rank, ("seen", seen))
    return out


@pytest.mark.parametrize("silent_host", [False, True])
def test_lost_ranks_match_a_loop_over_slots(silent_host: bool) -> None:
    """A crashed process (its rows vanish), and the same job with one host's
    records dropped after 4 s (a silent host)."""
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=7.0, seed=2, job_id="lost")
    out = ListWriter()
    simulate(cfg, [parse_spec("process-crash:rank=20,at=3")], out)
    an = Analyzer("lost")
    t0 = out.records[0][0]
    for ts, rec in out.records:
        host = getattr(getattr(rec, "header", rec), "host", "")
        if silent_host and ts > t0 + 4e9 and host == "node0005":
            continue
        an.ingest(rec, ts)
    ctx = an.ctx
    newest = max(h.last_now_ns for h in ctx.store.hosts.values())
    found: set[str] = set()
    for after_s in (0.0, 0.5, 1.0, 2.0, 3.0):
        now = newest + int(after_s * 1e9)
        got = lost_ranks(ctx, now)
        assert got == _lost_reference(ctx, now)
        assert list(got) == list(_lost_reference(ctx, now))  # same order
        found |= {how for how, _ in got.values()}
    assert ("host" in found) == silent_host
    assert found & {"rows", "seen"}  # the crashed process


def test_group_medians_are_numpy_medians_per_key() -> None:
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 9, 400).astype(np.int32)
    values = rng.integers(-50, 50, 400).astype(np.int32)
    got_keys, got = group_medians(keys, values)
    assert got_keys.tolist() == sorted(set(keys.tolist()))
    want = [float(np.median(values[keys == k])) for k in got_keys.tolist()]
    assert got.tolist() == want


def test_group_ids_number_groups_in_key_order_with_their_first_rows() -> None:
    a = np.array([3, 1, 3, 1, 2, 3], np.uint64)
    b = np.array([0, 5, 0, 4, 9, 1], np.int64)
    group, first = group_ids(a, b)
    assert group.tolist() == [3, 1, 3, 0, 2, 4]  # (1,4) (1,5) (2,9) (3,0) (3,1)
    assert first.tolist() == [3, 1, 4, 0, 5]
    empty = np.zeros(0, np.int64)
    assert [x.tolist() for x in group_ids(empty, empty)] == [[], []]


def test_members_reduce_each_op_as_its_collective_stat_does() -> None:
    rng = np.random.default_rng(5)
    stats = []
    for seq, n in enumerate([1, 4, 3, 8]):
        issue = rng.integers(0, 1000, n).astype(np.int64)
        start = np.where(rng.random(n) < 0.3, 0, issue + rng.integers(1, 50, n))
        end = issue + rng.integers(100, 900, n)
        ranks = rng.permutation(16)[:n].astype(np.int32)
        stats.append(CollectiveStat(7, seq, 0, 1, ranks, issue, start, end, issue - 5))
    mem = Members(stats)
    assert mem.span().tolist() == [s.span_ns for s in stats]
    assert (
        mem.off_median(mem.begin).tolist()
        == np.concatenate([s.lateness_ns() for s in stats]).tolist()
    )
    assert (
        mem.off_median(mem.end).tolist()
        == np.concatenate([s.end_lag_ns() for s in stats]).tolist()
    )
    assert mem.per_op(np.minimum, mem.end - mem.begin).tolist() == [
        s.xfer_ns for s in stats
    ]
    assert mem.rank.tolist() == np.concatenate([s.ranks for s in stats]).tolist()
    assert mem.op.tolist() == [0] + [1] * 4 + [2] * 3 + [3] * 8
    assert len(Members([]).op) == 0


def _mixed_ops(rng: np.random.Generator) -> list[CollectiveStat]:
    """Ops joined in three rounds (one block each), ops made one by one and
    the same restored from snapshots, in that order."""
    tracker, stats = CompletionTracker(), []
    for rnd in range(3):
        n_ops, world = 5 + rnd, 4
        rows = empty(DONE_OP_COLUMNS, n_ops * world)
        rows["comm"] = 9 + rnd
        rows["seq"] = np.repeat(np.arange(n_ops) + 10 * rnd, world)
        rows["kind"] = rnd
        rows["bytes"] = np.repeat(2 ** np.arange(n_ops), world)
        rows["rank"] = np.tile(np.arange(world), n_ops)
        rows["issue_ns"] = rng.integers(1, 10**6, len(rows))
        rows["start_ns"] = np.where(
            rng.random(len(rows)) < 0.3, 0, rows["issue_ns"] + 7
        )
        rows["end_ns"] = rows["issue_ns"] + rng.integers(100, 10**4, len(rows))
        stats += tracker._build(rows, np.full(n_ops, world))
    made = [
        CollectiveStat(3, k, 0, 1, np.arange(k + 1, dtype=np.int32),
                       *rng.integers(1, 10**6, (3, k + 1)), np.full(k + 1, -1))
        for k in range(3)
    ]  # fmt: skip
    return stats + made + [roundtrip(s) for s in made]


def test_members_gather_ops_of_several_join_rounds_in_any_order() -> None:
    """Ops of several blocks, shuffled: every column equals the ops' own
    arrays concatenated."""
    rng = np.random.default_rng(11)
    stats = _mixed_ops(rng)
    order = [stats[i] for i in rng.permutation(len(stats))]
    mem = Members(order)
    for got, name in (
        (mem.rank, "ranks"),
        (mem.issue, "issue_ns"),
        (mem.end, "end_ns"),
        (mem.begin, "begin_ns"),
    ):
        want = np.concatenate([getattr(s, name) for s in order])
        assert got.tolist() == want.tolist()
    assert mem.span().tolist() == [s.span_ns for s in order]
    keys = (mem.comm, mem.kind, mem.nbytes)
    assert [k.tolist() for k in keys] == [
        [s.comm for s in order],
        [s.kind for s in order],
        [s.nbytes for s in order],
    ]
    for i in (0, len(order) // 2, len(order) - 1):
        assert mem.ranks_of(i).tolist() == order[i].ranks.tolist()


_OP_FIELDS = ("comm", "seq", "kind", "nbytes", "first_issue_ns", "last_end_ns")
_MEMBER_FIELDS = ("ranks", "issue_ns", "start_ns", "end_ns", "prev_issue_ns")


def test_recent_stats_snapshot_as_columns_and_restore_every_op() -> None:
    """A snapshot packs the kept ops of every comm into two arrays; each
    restored op has the original's identity, member columns and spans, in
    the same order per comm, and reads like the original in ``Members``."""
    rng = np.random.default_rng(12)
    stats = _mixed_ops(rng)
    recent = RecentStats(per_comm=6)
    recent.extend([stats[i] for i in rng.permutation(len(stats))])
    back = roundtrip(recent)
    assert back.per_comm == 6
    assert len(back) == len(recent) > 12
    for a, b in zip(recent, back, strict=True):
        assert [getattr(b, f) for f in _OP_FIELDS] == [
            getattr(a, f) for f in _OP_FIELDS
        ]
        for f in _MEMBER_FIELDS:
            assert getattr(b, f).tolist() == getattr(a, f).tolist()
        assert (b.span_ns, b.lateness_ns().tolist()) == (
            a.span_ns,
            a.lateness_ns().tolist(),
        )
    by_comm = recent._by_comm  # noqa: SLF001 - the order each comm keeps
    assert {c: [s.seq for s in ops] for c, ops in back._by_comm.items()} == {  # noqa: SLF001
        c: [s.seq for s in ops] for c, ops in by_comm.items()
    }
    old, new = Members(list(recent)), Members(list(back))
    assert old.span().tolist() == new.span().tolist()
    assert old.begin.tolist() == new.begin.tolist()
    assert len(roundtrip(RecentStats())) == 0


def test_topology_survives_a_snapshot_and_its_caches_are_rebuilt() -> None:
    """A snapshot holds the topology's maps, not its caches."""
    topo = JobTopology()
    rec = samples.topology()
    topo.add(rec)
    assert roundtrip(topo) == topo
    other = replace(rec, host="host-1", ranks=(replace(rec.ranks[0], rank=1),))
    topo.add(other)
    assert topo.comm_sizes() == {samples.COMM: 2}  # cached
    back = roundtrip(topo)
    assert not [k for k in vars(back) if k.startswith("_")]
    assert back == topo
    assert back.host_of(1) == "host-1"
    assert back.comm_sizes() == {samples.COMM: 2}
