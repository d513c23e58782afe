"""Slowdown detection on completed collectives, fed in blocks.

Every completed collective feeds its op baselines and one lateness baseline
per member (see :func:`observe_collectives`), and its cross-host send flows'
counter gaps feed the role's G-T and T-D baselines. The per-collective
metrics are kept as :class:`~mycroft.streams.core.baseline_columns.BaselineColumns`
and applied a block at a time: the analyzer queues its completed collectives
and observes them before anything reads the baselines, which gives the same
verdicts as one collective at a time (tests/unit/core/test_fast_paths.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mycroft.schemas.records import Anomaly
from mycroft.schemas.text import comm_hex
from mycroft.schemas.vocab import OP_NAMES, SEND, FaultKind
from mycroft.streams.core.baseline import RobustBaseline, Verdict, size_buckets
from mycroft.streams.core.baseline_columns import WARMUP, BaselineColumns, Observed
from mycroft.streams.core.collective_stat import CollectiveStat, Members
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext, new_anomaly
from mycroft.streams.core.flow_features import posted_gap, sent_and_posted
from mycroft.streams.core.hold_back import Hold, advance_holds, op_holds
from mycroft.streams.core.rows import group_ids, group_medians, stack_rows
from mycroft.streams.core.scoring import PEERS

FlowGaps = dict[int, tuple[float, float]]
"""``rank -> (median G-T, median T-D)`` of one op's cross-host sends (chunks)."""

Completed = tuple[CollectiveStat, int, FlowGaps]
"""A completed collective, the analyzer's clock when it completed, its gaps."""

P2P_KINDS = (OP_NAMES.index("send"), OP_NAMES.index("recv"))
"""``op_kind`` codes of point-to-point ops (pipeline send/recv)."""

GAP_CLOCK_SLACK_NS = 100_000_000
"""Snapshots this much older than an op's first issue, or newer than its last
completion, are not searched for it (host clocks differ by milliseconds)."""


def observe_collective(
    ctx: DetectContext, stat: CollectiveStat, now_ns: int
) -> list[Anomaly]:
    """Feed one completed collective to its baselines; return slowdowns
    (:func:`observe_collectives` of one)."""
    return observe_collectives(ctx, [(stat, now_ns, op_flow_gaps(ctx, stat))])


def observe_collectives(ctx: DetectContext, done: Sequence[Completed]) -> list[Anomaly]:
    """Feed completed collectives, in completion order; return slowdowns.

    Metrics, keyed by (comm, op kind, size bucket): ``xfer`` (the shortest
    per-rank start-to-end time, i.e. the transfer once every member arrived,
    on one host clock) and ``span`` (first kernel start to last end); keyed by
    (comm, rank): ``late`` (kernel start minus the members' median).

    Arrival skew belongs to the per-rank ``late`` metric, whose persistence
    is per rank (``late_persist`` of ``late_of``): independent one-off
    stragglers on different ranks of a comm must not add up to a
    "persistent" slowdown. ``span`` therefore fires only when SEVERE. The
    late floor is half the op's median span before the op. A collective
    that fired nothing teaches its comm's ``span_any`` (first CPU enqueue to
    last end, which runs ahead of the GPU by up to a compute segment): the
    hang threshold's baseline.

    Anomalies come per collective in this order: span, xfer, late (member
    order), then its flow lag (:func:`observe_flow_lag`).
    """
    if not done:
        return []
    cfg, fam = ctx.cfg, ctx.book.families
    mem = Members([d[0] for d in done])
    m, comm, kind, bucket = _metrics(mem), mem.comm, mem.kind, size_buckets(mem.nbytes)
    op_floor = cfg.slow_abs_floor_s * 1e9
    span, xfer = (
        _observe(fam[name], (comm, kind, bucket), name, v, op_floor, ctx)
        for name, v in (("span", m.span), ("xfer", m.xfer))
    )
    floors = np.maximum(cfg.late_floor_s * 1e9, 0.5 * span.median_before)
    late = _observe_late(fam["late"], m, np.repeat(floors, m.size), ctx)
    _p2p_schedule_fires_nothing(span, late, mem, m)
    late_fired = np.zeros(len(done), bool)
    np.logical_or.at(late_fired, m.op, late.fired)
    usual = np.where(late.verdict != WARMUP, late.median_before, np.nan)
    rows = op_holds(mem, m.late, usual, floors, cfg)
    fam_holds, holds = advance_holds(ctx.book.holds, rows, cfg)
    ctx.book.holds = fam_holds
    late_fired[[h.op for h in holds]] = True
    quiet = np.flatnonzero(~(span.fired | xfer.fired | late_fired))
    _observe(fam["span_any"], (comm[quiet],), "span_any", m.queued[quiet], 1e18, ctx)
    return _report(ctx, done, m, {"span": span, "xfer": xfer, "late": late}, holds)


def _p2p_schedule_fires_nothing(
    span: Observed, late: Observed, mem: Members, m: _Metrics
) -> None:
    """Clear what point-to-point ops fired on span and lateness (in place).

    A send/recv pair's first start is often the receiver arming its buffers,
    and when the sender arrives is set by the op's place in the pipeline
    schedule (1F1B warm-up, steady state, cool-down, the first exchange after
    the optimizer), which changes within every step: the pair's span holds a
    pipeline bubble (GPipe: 0.66 s at the first exchange of a step, 60 times
    the median) and its skew recurs at the same places every step, which a
    per-rank median mixes. Both still feed their baselines (the root cause
    reads lateness; quiet spans set the hang threshold); a pair that stops is
    a hang, and a slow transfer still fires on ``xfer``.
    """
    p2p = np.isin(mem.kind, P2P_KINDS)
    if p2p.any():
        span.fired[p2p] = False
        late.fired[np.repeat(p2p, m.size)] = False


def _report(
    ctx: DetectContext,
    done: Sequence[Completed],
    m: _Metrics,
    seen: dict[str, Observed],
    holds: Sequence[Hold],
) -> list[Anomaly]:
    """The slowdowns of a block: per collective, what its samples fired
    (span, xfer, late by member, holds by rank), then its flow lag."""
    late = seen["late"]
    late_by_op: dict[int, list[int]] = {}
    for j in np.flatnonzero(late.fired).tolist():
        late_by_op.setdefault(int(m.op[j]), []).append(j)
    busy = seen["span"].fired | seen["xfer"].fired
    busy[list(late_by_op)] = True
    holds_by_op: dict[int, list[Hold]] = {}
    for h in holds:
        holds_by_op.setdefault(h.op, []).append(h)
    busy[list(holds_by_op)] = True
    # Most ops fire nothing and no snapshot caught their flows in flight.
    some = {i for i, d in enumerate(done) if d[2]}.union(np.flatnonzero(busy).tolist())
    out: list[Anomaly] = []
    for i in sorted(some):
        stat, now_ns, gaps = done[i]
        for metric, value in (("span", m.span[i]), ("xfer", m.xfer[i])):
            if seen[metric].fired[i]:
                median = float(seen[metric].median_after[i])
                out.append(
                    _slow_anomaly(ctx, stat, metric, float(value), median, (), now_ns)
                )
        for j in late_by_op.get(i, ()):
            median, rank = float(late.median_after[j]), (int(m.rank[j]),)
            out.append(
                _slow_anomaly(ctx, stat, "late", float(m.late[j]), median, rank, now_ns)
            )
        out += [_hold_anomaly(ctx, stat, h, now_ns) for h in holds_by_op.get(i, ())]
        out += observe_flow_lag(ctx, stat, gaps, now_ns)
    return out


class _Metrics:
    """Per-op and per-member metrics of a block of collectives (ops in block
    order, members in op order then member order)."""

    def __init__(self, n_ops: int, n_members: int) -> None:
        self.span, self.xfer, self.queued = (
            np.zeros(n_ops),
            np.zeros(n_ops),
            np.zeros(n_ops),
        )
        self.size = np.zeros(n_ops, np.int64)
        self.op = np.zeros(n_members, np.int64)
        self.comm = np.zeros(n_members, np.uint64)
        self.rank = np.zeros(n_members, np.int64)
        self.late = np.zeros(n_members)


def _metrics(mem: Members) -> _Metrics:
    """Compute every op's span, xfer, queued span and every member's lateness
    over the members of all ops at once (the arithmetic of ``CollectiveStat``;
    every op has a member)."""
    m = _Metrics(len(mem.size), len(mem.op))
    if not len(mem.size):
        return m
    m.size, m.op, m.rank = mem.size, mem.op, mem.rank
    last_end = mem.per_op(np.maximum, mem.end)
    m.span[:] = last_end - mem.per_op(np.minimum, mem.begin)
    m.xfer[:] = mem.per_op(np.minimum, mem.end - mem.begin)
    m.queued[:] = last_end - mem.per_op(np.minimum, mem.issue)
    m.comm = np.repeat(mem.comm, mem.size)
    m.late = mem.off_median(mem.begin)
    return m


def _observe(  # noqa: PLR0913, PLR0917 - private helper of one module
    columns: BaselineColumns,
    keys: tuple[np.ndarray, ...],
    name: str,
    values: np.ndarray,
    floors: float | np.ndarray,
    ctx: DetectContext,
) -> Observed:
    """Observe ``values`` under the keys ``(*keys[:, i], name)``, one per
    value, in one block; new keys get rows in order of first appearance."""
    n = len(values)
    rows = np.zeros(n, np.int64)
    if n:
        group, first = group_ids(*keys)
        seen = np.argsort(first)
        cols = [k[first[seen]].tolist() for k in keys]
        found = columns.row_of([(*k, name) for k in zip(*cols, strict=True)])
        row_of_group = np.empty(len(seen), np.int64)
        row_of_group[seen] = found
        rows = row_of_group[group]
    floor = np.broadcast_to(np.asarray(floors, np.float64), values.shape)
    return columns.observe(rows, values.astype(np.float64), floor, ctx.cfg)


def _observe_late(
    columns: BaselineColumns, m: _Metrics, floors: np.ndarray, ctx: DetectContext
) -> Observed:
    """Observe every member's lateness under its (comm, rank) key."""
    pair, first = group_ids(m.comm, m.rank)
    rows = columns.rows_of_pairs(m.comm[first], m.rank[first], "late")[pair]
    return columns.observe(rows, m.late, floors, ctx.cfg)


def role_gap_baseline(ctx: DetectContext, comm: int, gap: str) -> RobustBaseline:
    """Return the pooled baseline of one counter gap (``"gt"`` = G-T or
    ``"td"`` = T-D, chunks) over every cross-host send flow of ``comm``'s role.

    Flows of one kind of communicator share a healthy gap (pipelining depth,
    wire latency times rate); pooling them warms the baseline within a few
    ops, and out-of-band samples are not learned.
    """
    info = ctx.topo.comms.get(comm)
    return ctx.book.get_scalar(("flow", info.role if info else "other", gap))


def gap_floor(pool: RobustBaseline, cfg: DetectorConfig) -> float:
    """Return the margin above ``pool``'s median that a counter gap must clear.

    Gaps are small whole-chunk counts with a multi-modal healthy law: 0 while
    a flow waits for its GPU or for credit, the burst size while granted
    slots are on the wire. Median and MAD collapse to 0 on such samples, and
    a healthy burst would read as a backlog; so the band also covers the
    healthy ``gap_quantile`` of the learned samples, times ``slow_ratio_min``.
    """
    if not pool.ordered:
        return cfg.gap_floor_chunks
    ordered = pool.ordered
    upper = ordered[min(len(ordered) - 1, int(cfg.gap_quantile * len(ordered)))]
    med = pool.stats()[0]
    return max(cfg.gap_floor_chunks, upper * cfg.slow_ratio_min - med)


def block_flow_gaps(
    ctx: DetectContext, stats: Sequence[CollectiveStat]
) -> list[FlowGaps]:
    """Return :func:`op_flow_gaps` of each of ``stats`` (completed together).

    Most ops run between two snapshots and no snapshot holds them: one pass
    over the snapshots of the block's time span collects the ops any of them
    caught, and only those are looked up.
    """
    if not stats:
        return []
    lo = min(s.first_issue_ns for s in stats) - GAP_CLOCK_SLACK_NS
    hi = max(s.last_end_ns for s in stats) + GAP_CLOCK_SLACK_NS
    caught: set[tuple[int, int]] = set()
    for hs in ctx.store.hosts.values():
        for tick, by_op in reversed(hs.sends):
            if tick < lo:
                break
            if tick <= hi:
                caught.update(by_op)
    return [op_flow_gaps(ctx, s) if (s.comm, s.seq) in caught else {} for s in stats]


def op_flow_gaps(ctx: DetectContext, stat: CollectiveStat) -> FlowGaps:
    """Return ``rank -> (median G-T, median T-D)`` in chunks over the op's
    send flows to other hosts, from the snapshots taken while it ran.

    Only snapshots of a started flow count (``progress.op_flow_index``):
    before its first chunk and after its last, every gap is zero. G-T
    counts the data the receiver had posted buffers for (its recv flows of
    the op; unknown counts as posted).
    Ops of one host, and ops no snapshot caught in flight, give nothing.
    Call it when the op completes: later snapshots are not the op's.
    """
    topo = ctx.topo
    where = topo.rank_host.get
    hosts = {where(r, "") for r in stat.ranks.tolist()}
    if len(hosts) < PEERS or "" in hosts:
        return {}
    cutoff = stat.first_issue_ns - GAP_CLOCK_SLACK_NS
    after = stat.last_end_ns + GAP_CLOCK_SLACK_NS
    key = (stat.comm, stat.seq)
    parts = []
    for name in hosts:
        hs = ctx.store.hosts.get(name)
        for tick, by_op in reversed(hs.sends if hs is not None else ()):
            if tick < cutoff:
                break
            if tick > after:  # taken after the op ended everywhere
                continue
            rows = by_op.get(key)
            if rows is not None:
                parts.append(rows)
    if not parts:
        return {}
    rows = stack_rows(parts)
    recv = rows[rows["dir"] != SEND]
    rows = rows[rows["dir"] == SEND]
    if not len(rows):
        return {}
    rank, peer = rows["rank"], rows["peer"]
    ids = np.unique(np.concatenate([rank, peer]))
    codes: dict[str, int] = {}
    names = [topo.host_of(x) for x in ids.tolist()]
    host = np.array([codes.setdefault(h, len(codes)) for h in names])
    # Receivers whose producer reports receive flows (``sent_and_posted``).
    reports = np.array(
        [(hs := ctx.store.hosts.get(h)) is not None and hs.reports_recv for h in names],
        dtype=bool,
    )
    away = host[np.searchsorted(ids, rank)] != host[np.searchsorted(ids, peer)]
    rows = rows[away]
    if not len(rows):
        return {}
    # G-T on the data the receiver had posted buffers for, as the root cause
    # reads it (``FlowFeatures.gt_chunks``): under credits a healthy sender
    # waits on its receiver's slots, which is no transport backlog.
    reporting = reports[np.searchsorted(ids, rows["peer"])]
    sent, posted = sent_and_posted(rows, recv, reporting)
    gap, _ = posted_gap(rows, sent, posted)
    ranks, gt = group_medians(rows["rank"], gap)
    _, td = group_medians(rows["rank"], rows["transmitted"] - rows["done"])
    return dict(
        zip(ranks.tolist(), zip(gt.tolist(), td.tolist(), strict=True), strict=True)
    )


def observe_flow_lag(
    ctx: DetectContext, stat: CollectiveStat, gaps: FlowGaps, now_ns: int
) -> list[Anomaly]:
    """Learn the role's G-T and T-D baselines from one op's ``gaps``; return a
    slowdown per rank whose cross-host sends keep a T-D lag above the role's
    and above their own.

    Transmitted-not-done growing while G-T stays small is the network (or the
    far side) acknowledging late: congestion that may barely stretch an op.
    How much is in flight depends on the flow (its op sizes, its NIC's share,
    a credit window), so a rank's lag is judged against its own history on
    the comm as well as the role's pool, and is no evidence until that
    history is warm. Persistence is per (comm, rank): 3 of its last 5 caught
    ops out of both bands.
    """
    cfg = ctx.cfg
    out: list[Anomaly] = []
    for rank, (gt, td) in sorted(gaps.items()):
        ready = role_gap_baseline(ctx, stat.comm, "gt")
        ready.observe(gt, cfg, gap_floor(ready, cfg))
        pool = role_gap_baseline(ctx, stat.comm, "td")
        pooled = pool.observe(td, cfg, gap_floor(pool, cfg))
        own = ctx.book.get_scalar((stat.comm, rank, "td"))
        mine = own.observe(td, cfg, gap_floor(own, cfg))
        high = (Verdict.HIGH, Verdict.SEVERE)
        own.recent[-1] = pooled in high and mine in high
        if own.recent[-1] and own.persistent(cfg):
            med = pool.stats()[0]
            out.append(
                new_anomaly(
                    ctx,
                    "slow_td",
                    f"{comm_hex(stat.comm)}:{stat.seq}:td{rank}",
                    FaultKind.SLOWDOWN,
                    (stat.comm,),
                    (rank,),
                    int(stat.issue_ns.min()),
                    now_ns,
                    f"seq {stat.seq} on comm {comm_hex(stat.comm)}: rank {rank}'s "
                    f"sends to other hosts keep {td:.1f} chunks transmitted-not-done "
                    f"(its own baseline {own.stats()[0]:.1f}, role {med:.1f})",
                    score=td / max(pool.threshold(cfg, gap_floor(pool, cfg)), 1.0),
                )
            )
    return out


def _hold_anomaly(
    ctx: DetectContext, stat: CollectiveStat, hold: Hold, now_ns: int
) -> Anomaly:
    name = OP_NAMES[stat.kind] if stat.kind < len(OP_NAMES) else str(stat.kind)
    return new_anomaly(
        ctx,
        "slow_hold",
        f"{comm_hex(stat.comm)}:{stat.seq}:hold{hold.rank}",
        FaultKind.SLOWDOWN,
        (stat.comm,),
        (hold.rank,),
        int(stat.issue_ns.min()),  # the op that fired, as every slowdown reports
        now_ns,
        f"{name} seq {stat.seq} on comm {comm_hex(stat.comm)}: rank {hold.rank} "
        f"alone held {hold.count} of the comm's last {ctx.cfg.hold_of} ops back, "
        f"{hold.held_ns / 1e6:.0f} ms beyond its usual lateness "
        f"({hold.share:.0%} of their time)",
        score=hold.share / ctx.cfg.hold_share_min,
    )


def _slow_anomaly(  # noqa: PLR0917 - private helper of one module
    ctx: DetectContext,
    stat: CollectiveStat,
    metric: str,
    value: float,
    median: float,
    ranks: tuple[int, ...],
    now_ns: int,
) -> Anomaly:
    name = OP_NAMES[stat.kind] if stat.kind < len(OP_NAMES) else str(stat.kind)
    who = f" rank {ranks[0]}" if ranks else ""
    onset = int(stat.issue_ns.min())
    return new_anomaly(
        ctx,
        f"slow_{metric}",
        f"{comm_hex(stat.comm)}:{stat.seq}:{metric}{who.strip()}",
        FaultKind.SLOWDOWN,
        (stat.comm,),
        ranks or tuple(stat.ranks.tolist()),
        onset,
        now_ns,
        f"{name} seq {stat.seq} on comm {comm_hex(stat.comm)}:{who} {metric} "
        f"{value / 1e6:.1f} ms vs baseline {median / 1e6:.1f} ms",
        score=value / max(median, 1.0),
    )
