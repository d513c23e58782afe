"""Column baselines and block observation against one baseline object per key
and one collective at a time: the verdicts, medians and anomalies must be
exactly those of the plain code."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

import numpy as np
import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.schemas.records import Anomaly
from mycroft.streams.analyze import Replay
from mycroft.streams.core import engine
from mycroft.streams.core.baseline import (
    BaselineBook,
    RobustBaseline,
    Verdict,
    size_bucket,
    size_buckets,
)
from mycroft.streams.core.baseline_columns import BaselineColumns, Rule
from mycroft.streams.core.collective_stat import CollectiveStat
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.detect_slow import (
    Completed,
    _hold_anomaly,
    _slow_anomaly,
    observe_collectives,
    observe_flow_lag,
)
from mycroft.streams.core.hold_back import Hold
from tests.unit.core.snapshot_roundtrip import roundtrip

RULES = [
    Rule(8, 5, shift=True),  # late
    Rule(5, 3, recur=True),  # xfer
    Rule(5, 3, fire_high=False),  # span
]


def _samples(rng: random.Random, keys: int, n: int) -> list[tuple[int, float, float]]:
    """(key, value, floor): noisy steady levels per key, with spikes, steps
    back and forth (shifts and sustained slowdowns), ties and a warm-up."""
    level = [rng.choice([1.0, 50.0, 1e6]) for _ in range(keys)]
    out = []
    for _ in range(n):
        k = rng.randrange(keys)
        roll = rng.random()
        if roll < 0.03:
            level[k] *= rng.choice([0.5, 2.0, 3.0])
        value = level[k] * (1 + rng.gauss(0, 0.05))
        if roll > 0.97:
            value *= rng.choice([5.0, 40.0])
        if roll < 0.1:
            value = round(value)  # repeated values
        out.append((k, value, rng.choice([0.0, 0.01, 1.0]) * level[k]))
    return out


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("seed", range(3))
def test_columns_give_each_key_what_its_own_baseline_gives(
    rule: Rule, seed: int
) -> None:
    cfg = DetectorConfig()
    rng = random.Random(seed)
    window = rng.choice([8, 16, 64])
    samples = _samples(rng, keys=12, n=3000)
    cols = BaselineColumns(window, rule)
    refs = [RobustBaseline(window) for _ in range(12)]
    far = [deque[bool](maxlen=cfg.recur_of) for _ in range(12)]
    fired_any = set()
    recurred = 0
    at = 0
    while at < len(samples):
        block = samples[at : at + rng.choice([1, 5, 40, 400])]
        at += len(block)
        rows = cols.row_of([("k", k) for k, _, _ in block])
        got = cols.observe(
            rows,
            np.array([v for _, v, _ in block]),
            np.array([f for *_, f in block]),
            cfg,
        )
        for i, (k, value, floor) in enumerate(block):
            base = refs[k]
            before = base.stats()[0]
            verdict = base.observe(value, cfg, floor, shift=rule.shift, of=rule.of)
            # Far out of band, recurring: the rule of DetectorConfig.recur_need.
            line = max(before * cfg.recur_ratio, before + cfg.recur_extra_s * 1e9)
            far[k].append(verdict in (Verdict.HIGH, Verdict.SEVERE) and value > line)
            recurs = rule.recur and far[k][-1] and sum(far[k]) >= cfg.recur_need
            alone = verdict is Verdict.HIGH and not base.persistent(cfg, rule.need)
            recurred += recurs and alone
            fired = (
                verdict is Verdict.SEVERE
                or (
                    verdict is Verdict.HIGH
                    and rule.fire_high
                    and base.persistent(cfg, rule.need)
                )
                or base.shift
                or recurs
            )
            assert list(Verdict)[got.verdict[i]] is verdict
            assert got.median_before[i] == before
            assert bool(got.fired[i]) == fired
            if fired:
                fired_any.add(verdict)
                assert got.median_after[i] == base.stats()[0]
    for k, base in enumerate(refs):
        (row,) = cols.row_of([("k", k)])
        med, sigma = cols.stats(np.array([row]))
        assert (float(med[0]), float(sigma[0])) == base.stats()
    assert fired_any  # the sequences do fire
    assert recurred or not rule.recur  # ...and the recurrence rule alone, too
    back = roundtrip(cols)
    rows = np.arange(12)
    assert all(
        (a == b).all() for a, b in zip(back.stats(rows), cols.stats(rows), strict=True)
    )


def _floor_ns(cfg: DetectorConfig, metric: str, med_span: float) -> float:
    if metric == "late":
        return float(max(cfg.late_floor_s * 1e9, 0.5 * med_span))
    return float(cfg.slow_abs_floor_s * 1e9)


def _one_at_a_time(
    ctx: DetectContext,
    book: dict[tuple[object, ...], RobustBaseline],
    done: Sequence[Completed],
) -> list[Anomaly]:
    """The plain rules: one ``RobustBaseline`` per key, one op after another."""
    cfg, out = ctx.cfg, []

    def get(key: tuple[object, ...]) -> RobustBaseline:
        return book.setdefault(key, RobustBaseline(cfg.baseline_window))

    windows: dict[int, deque[tuple[int, int, int, float, int]]] = {}
    for stat, now_ns, gaps in done:
        key = (stat.comm, stat.kind, size_bucket(stat.nbytes))
        med_span = get((*key, "span")).stats()[0]
        usual = [
            get((stat.comm, r, "late")).stats()[0]
            if get((stat.comm, r, "late")).warm
            else None
            for r in stat.ranks.tolist()
        ]
        samples = [
            ("span", (*key, "span"), float(stat.span_ns), ()),
            ("xfer", (*key, "xfer"), float(stat.xfer_ns), ()),
        ] + [
            ("late", (stat.comm, r, "late"), float(lt), (r,))
            for r, lt in zip(
                stat.ranks.tolist(), stat.lateness_ns().tolist(), strict=True
            )
        ]
        fired = []
        for metric, bkey, value, ranks in samples:
            base = get(bkey)
            per_rank = metric == "late"
            of, need = (cfg.late_of, cfg.late_persist) if per_rank else (None, None)
            verdict = base.observe(
                value, cfg, _floor_ns(cfg, metric, med_span), shift=per_rank, of=of
            )
            high = verdict is Verdict.HIGH and metric != "span"
            if (
                verdict is Verdict.SEVERE
                or (high and base.persistent(cfg, need))
                or base.shift
            ):
                median = base.stats()[0]
                fired.append(
                    _slow_anomaly(ctx, stat, metric, value, median, ranks, now_ns)
                )
        fired += _held_back(ctx, windows, stat, usual, med_span, now_ns)
        if not fired:
            get((stat.comm, "span_any")).observe(float(stat.queued_span_ns), cfg, 1e18)
        out += fired + observe_flow_lag(ctx, stat, gaps, now_ns)
    return out


def _held_back(  # noqa: PLR0913, PLR0917 - the reference's state
    ctx: DetectContext,
    windows: dict[int, deque[tuple[int, int, int, float, int]]],
    stat: CollectiveStat,
    usual: list[float | None],
    med_span: float,
    now_ns: int,
) -> list[Anomaly]:
    """The hold rule one op at a time: who alone arrived last, by how much
    beyond its usual lateness, summed over the comm's last ``hold_of`` ops."""
    cfg = ctx.cfg
    if len(stat.ranks) < cfg.hold_min_members:
        return []
    begin = stat.begin_ns.tolist()
    order = sorted(range(len(begin)), key=lambda i: begin[i])
    last, second = order[-1], order[-2]
    late = float(stat.lateness_ns()[last])
    u = usual[last]
    excess = 0.0 if u is None else min(begin[last] - begin[second], late - u)
    held = excess >= _floor_ns(cfg, "late", med_span)
    holder = int(stat.ranks[last]) if held else -1
    win = windows.setdefault(stat.comm, deque(maxlen=cfg.hold_of))
    win.append(
        (int(stat.begin_ns.min()), int(stat.end_ns.max()), holder, excess, stat.seq)
    )
    mine = [w for w in win if w[2] == holder]
    if not held or len(mine) < cfg.hold_need:
        return []
    seqs = {w[4] for w in mine}  # the latest and need - 1 more, one step apart,
    last = stat.seq  # on time somewhere in between
    if not any(
        all(last - k * (last - s) in seqs for k in range(1, cfg.hold_need))
        and any(last - j not in seqs for j in range(1, last - s))
        for s in seqs
        if s < last - 1
    ):
        return []
    elapsed = max(w[1] for w in win) - min(w[0] for w in win)
    share = sum(w[3] for w in mine) / max(elapsed, 1)
    if share < cfg.hold_share_min:
        return []
    hold = Hold(0, holder, len(mine), sum(w[3] for w in mine), share)
    return [_hold_anomaly(ctx, stat, hold, now_ns)]


@pytest.fixture(scope="module")
def completed() -> tuple[DetectContext, list[Completed], list[Anomaly]]:
    """What a 64-rank analyzer observed over 14 s with a slow GPU and a slow
    NIC (every completed op, and the slowdowns it returned)."""
    seen: list[Completed] = []
    fired: list[Anomaly] = []

    def spy(ctx: DetectContext, done: Sequence[Completed]) -> list[Anomaly]:
        seen.extend(done)
        found = observe_collectives(ctx, done)
        fired.extend(found)
        return found

    faults = ["gpu-power-cap:rank=9,at=4", "nic-bandwidth:rank=40,at=8,severity=0.7"]
    mp = pytest.MonkeyPatch()
    mp.setattr(engine, "observe_collectives", spy)
    replay = Replay()
    try:
        cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=14.0, seed=5, job_id="cols")
        simulate(cfg, [parse_spec(f) for f in faults], replay)
    finally:
        mp.undo()
    return replay.analyzers["cols"].ctx, seen, fired


def test_blocks_fire_what_one_op_at_a_time_fires(
    completed: tuple[DetectContext, list[Completed], list[Anomaly]],
) -> None:
    ctx, done, fired = completed
    detectors = {a.detector for a in fired}
    assert {"slow_late", "slow_xfer"} <= detectors, detectors
    fresh = DetectContext(ctx.job_id, ctx.store, ctx.topo, BaselineBook(64), ctx.cfg)
    assert fired == _one_at_a_time(fresh, {}, done)


@pytest.mark.parametrize("block", [1, 7, 5000])
def test_where_the_blocks_end_changes_nothing(
    completed: tuple[DetectContext, list[Completed], list[Anomaly]], block: int
) -> None:
    ctx, done, fired = completed
    fresh = DetectContext(ctx.job_id, ctx.store, ctx.topo, BaselineBook(64), ctx.cfg)
    got = []
    for at in range(0, len(done), block):
        got += observe_collectives(fresh, done[at : at + block])
    assert got == fired
    late = fresh.book.families["late"]
    some = [k for k in late.rows][:50]
    ref: dict[tuple[object, ...], RobustBaseline] = {}
    _one_at_a_time(
        DetectContext(ctx.job_id, ctx.store, ctx.topo, BaselineBook(64), ctx.cfg),
        ref,
        done,
    )
    for key in some:
        view = fresh.book.find(key)
        assert view is not None
        assert view.stats() == ref[key].stats()
        assert view.warm == ref[key].warm


def test_a_family_key_has_no_scalar_baseline() -> None:
    book = BaselineBook(8)
    assert book.find((1, 2, "late")) is None
    view = book.get((1, 2, "late"))
    assert view.observe(5.0, DetectorConfig(), 1.0) is Verdict.WARMUP
    assert book.find((1, 2, "late")) is not None
    with pytest.raises(TypeError, match="column family"):
        book.get_scalar((1, 2, "late"))
    assert isinstance(book.get_scalar(("flow", "dp", "td")), RobustBaseline)


def test_size_buckets_are_bit_lengths() -> None:
    sizes = [0, 1, 2, 3, 4, 1023, 1024, 1025, (1 << 40) - 1, 1 << 40, (1 << 63) - 1]
    sizes += [-1, -1024]
    got = size_buckets(np.array(sizes, np.int64)).tolist()
    assert got == [size_bucket(n) for n in sizes]


def test_pair_rows_by_number_are_the_tuple_rows() -> None:
    rng = np.random.default_rng(3)
    by_number, by_tuple = BaselineColumns(4, RULES[0]), BaselineColumns(4, RULES[0])
    for _ in range(6):  # blocks of distinct pairs, some seen before, some new
        comm = rng.choice(np.array([7, 1 << 63, (1 << 64) - 1, 42], np.uint64), 30)
        rank = rng.integers(0, 50, 30)
        pairs = sorted(set(zip(comm.tolist(), rank.tolist(), strict=True)))
        a = np.array([p[0] for p in pairs], np.uint64)
        b = np.array([p[1] for p in pairs], np.int64)
        got = by_number.rows_of_pairs(a, b, "late")
        assert got.tolist() == by_tuple.row_of([(*p, "late") for p in pairs]).tolist()
    assert by_number.rows == by_tuple.rows
    # A rank outside [0, 2**32) takes the tuple path and gets the same row.
    (row,) = by_number.rows_of_pairs(np.array([7], np.uint64), np.array([-1]), "late")
    assert by_number.rows[(7, -1, "late")] == row
