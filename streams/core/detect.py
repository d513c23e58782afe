"""Detectors: pure functions from progress state to ``Anomaly`` values.

* hang: a communicator has work in flight and no counter of any member moved
  for longer than an adaptive threshold (a multiple of its healthy op span).
* silence: a host whose batches stop, or a rank whose rows vanish or whose
  ``seen_ns`` goes stale while its host still reports, and peers wait on it.
* slowdown (``detect_slow``): a completed collective leaves the robust band
  of its baseline (transfer time, per-rank late arrival; a severe span), or
  its send flows to other hosts keep a transmitted-not-done lag (T-D) above
  their role's; or one rank alone keeps a group waiting for a real share
  of its time (``hold_back``: one late op a step).
* mismatch: members disagree on op kind, or on size where the op's size
  rule says sizes agree (``schemas/op_sizes.py``), at one ``(comm, seq)``.
* port flaps (``detect_ports``) and transfers slowed on the wire
  (``detect_wire``): a part's own measurement, though no op slows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mycroft.schemas.op_sizes import sizes_may_differ
from mycroft.schemas.records import Anomaly
from mycroft.schemas.text import comm_hex
from mycroft.schemas.vocab import OP_NAMES, FaultKind
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.completions import matching_kind
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.escalation import consequences
from mycroft.streams.core.progress import ProgressStore
from mycroft.streams.core.rows import run_starts
from mycroft.streams.core.stall_rhythm import StallRhythm, stall_holders
from mycroft.streams.core.topology import JobTopology


@dataclass(frozen=True)
class DetectContext:
    """What every detector reads: state, topology, baselines, thresholds."""

    job_id: str
    store: ProgressStore
    topo: JobTopology
    book: BaselineBook
    cfg: DetectorConfig


def new_anomaly(  # noqa: PLR0917 - one constructor, every field named
    ctx: DetectContext,
    detector: str,
    key: str,
    kind: FaultKind,
    comms: tuple[int, ...],
    ranks: tuple[int, ...],
    onset_ns: int,
    now_ns: int,
    summary: str,
    score: float = 1.0,
) -> Anomaly:
    return Anomaly(
        anomaly_id=f"{ctx.job_id}:{detector}:{key}",
        job_id=ctx.job_id,
        kind=kind,
        comms=comms,
        ranks=ranks,
        onset_ns=onset_ns,
        detected_ns=now_ns,
        detector=detector,
        summary=summary,
        score=score,
    )


def hang_threshold_ns(ctx: DetectContext, comm: int) -> int:
    """Return the no-progress time after which ``comm`` counts as hung (ns).

    ``clamp(max(mult * median_span, median_span + 8 sigma), hang_min, hang_max)``
    over the comm's healthy op spans (waits for late peers and PP bubbles
    included); ``hang_min`` while the baseline warms up.
    """
    cfg = ctx.cfg
    lo, hi = cfg.hang_min_s * 1e9, cfg.hang_max_s * 1e9
    base = ctx.book.find((comm, "span_any"))
    if base is None or not base.warm:
        return int(lo)
    med, sigma = base.stats()
    return int(min(hi, max(lo, cfg.hang_span_mult * med, med + 8 * sigma)))


def comm_last_progress(store: ProgressStore) -> dict[int, tuple[int, int, bool]]:
    """Return ``comm -> (last progress ns, latest host tick ns, work in flight)``."""
    s = store.slots
    if not len(s):
        return {}
    host_tick = store.host_tick_of_slots()
    prog = np.maximum(s["issued_change_ns"], s["done_change_ns"])
    # One pass per column over the slots grouped by comm (reduceat), not a
    # mask per comm: a 1,024-rank job has hundreds of comms.
    order = np.argsort(s["comm"], kind="stable")
    comm_sorted = s["comm"][order]
    first = np.flatnonzero(run_starts(comm_sorted))
    comms = comm_sorted[first]
    issued, done = s["issued"][order], s["done"][order]
    last = np.maximum.reduceat(prog[order], first)
    ops = store.in_flight_ops()
    if len(ops):  # in-flight ops of comms with slots (others are not judged)
        at = np.minimum(np.searchsorted(comms, ops["comm"]), len(comms) - 1)
        known = comms[at] == ops["comm"]
        np.maximum.at(last, at[known], ops["prog_ns"][known])
    top_issued = np.maximum.reduceat(issued, first)
    sizes = np.diff(np.r_[first, len(order)])
    lagging = (issued > done) | (done < np.repeat(top_issued, sizes))
    busy = np.maximum.reduceat(lagging, first)
    tick = np.maximum.reduceat(host_tick[order], first)
    return {
        c: (t_last, t_tick, b)
        for c, t_last, t_tick, b in zip(
            comms.tolist(), last.tolist(), tick.tolist(), busy.tolist(), strict=True
        )
    }


def hung_since_ns(ctx: DetectContext) -> int | None:
    """When the job's first hang set in: the earliest time a busy comm's
    stall passed its hang threshold (None: no comm is hung)."""
    out: int | None = None
    for comm, (last, tick, busy) in comm_last_progress(ctx.store).items():
        if not busy or last <= 0:
            continue
        at = last + hang_threshold_ns(ctx, comm)
        if tick > at and (out is None or at < out):
            out = at
    return out


def detect_hangs(
    ctx: DetectContext, now_ns: int, rhythm: StallRhythm | None = None
) -> list[Anomaly]:
    """Return a HANG anomaly per busy comm whose progress stopped too long.

    With ``rhythm``, stalls are remembered as they resolve, and a stall
    within the bound of its comm's and holders' earlier pauses is a
    recurring pause, not a hang (``stall_rhythm``).
    """
    out: list[Anomaly] = []
    shortest = ctx.cfg.hang_min_s * 1e9  # no threshold is below it
    progress = comm_last_progress(ctx.store)
    if rhythm is not None:
        rhythm.step(progress)
    least = ctx.cfg.rhythm_min_s * 1e9
    waiting = {c for c, (last, tick, busy) in progress.items() if busy and tick > last}
    for comm, (last, tick, busy) in progress.items():
        if not busy or last <= 0:
            continue
        stall = tick - last
        if rhythm is not None and stall >= least:
            holders = rhythm.held(comm, last)
            if holders is None:
                holders = stall_holders(ctx.store, comm, waiting)
            if rhythm.watch(comm, holders, last, stall) and stall > shortest:
                continue
        if stall <= shortest:
            continue
        limit = hang_threshold_ns(ctx, comm)
        if stall <= limit:
            continue
        out.append(_hang(ctx, comm, last, now_ns, stall, limit))
    return out


def _hang(  # noqa: PLR0913, PLR0917 - private constructor of one anomaly
    ctx: DetectContext, comm: int, last: int, now_ns: int, stall: int, limit: int
) -> Anomaly:
    s = ctx.store.slots
    m = (s["comm"] == comm) & (s["issued"] > s["done"])
    ranks = tuple(sorted(set(s["rank"][m].tolist())))
    frontier = int(s["done"][s["comm"] == comm].min()) + 1
    return new_anomaly(
        ctx,
        "hang",
        f"{comm_hex(comm)}:{frontier}",
        FaultKind.HANG,
        (comm,),
        ranks,
        last,
        now_ns,
        f"comm {comm_hex(comm)} made no progress for {stall / 1e9:.2f} s "
        f"(limit {limit / 1e9:.2f} s) at seq {frontier}",
        score=stall / max(limit, 1),
    )


def _silence_limit_ns(cfg: DetectorConfig, gap_ns: float) -> int:
    return int(max(cfg.silence_min_s * 1e9, cfg.silence_tick_mult * gap_ns))


def _median_gap(store: ProgressStore) -> float:
    gaps = [h.gap_ns for h in store.hosts.values() if h.gap_ns > 0]
    return float(np.median(gaps)) if gaps else 0.0


def lost_ranks(ctx: DetectContext, now_ns: int) -> dict[int, tuple[str, int]]:
    """Return ``rank -> (how, last sign of life ns)`` for ranks that went silent.

    ``how`` is ``"host"`` (its host's batches stopped while others' continue),
    ``"rows"`` (its rows vanished) or ``"seen"`` (its ``seen_ns`` went stale).
    """
    store, cfg = ctx.store, ctx.cfg
    out: dict[int, tuple[str, int]] = {}
    if not store.hosts:
        return out
    # A host is silent when it falls behind the job's newest arrival, not
    # behind the clock: a worker that stalls or catches up on a backlog sees
    # every host's records late but in order, and must not call them lost.
    newest = max(h.last_now_ns for h in store.hosts.values())
    if now_ns - newest > _silence_limit_ns(cfg, _median_gap(store)):
        return out  # the whole stream stopped: nothing to compare with
    fresh_hosts = {
        h.index
        for h in store.hosts.values()
        if newest - h.last_now_ns <= _silence_limit_ns(cfg, h.gap_ns)
    }
    hosts = list(store.hosts.values())
    s = store.slots
    host = s["host"]
    limit = np.array([_silence_limit_ns(cfg, h.gap_ns) for h in hosts], np.int64)[host]
    stale_host = ~np.array([h.index in fresh_hosts for h in hosts], bool)[host]
    tick, seen = s["tick_ns"], s["seen_ns"]
    rows_gone = store.host_tick_of_slots() - tick > limit
    seen_stale = (seen > 0) & (tick - seen > limit)
    # Python only for the slots of lost ranks, in slot order: a silent host
    # overrides what the rank's earlier slots said, the other two do not.
    for i in np.flatnonzero(stale_host | rows_gone | seen_stale).tolist():
        rank = int(s["rank"][i])
        if stale_host[i]:
            out[rank] = ("host", int(tick[i]))
        elif rows_gone[i]:
            out.setdefault(rank, ("rows", int(tick[i])))
        else:
            out.setdefault(rank, ("seen", int(seen[i])))
    return out


def detect_silence(ctx: DetectContext, now_ns: int) -> list[Anomaly]:
    """Return a HANG anomaly per lost rank whose live peers wait on it."""
    lost = lost_ranks(ctx, now_ns)
    if not lost:
        return []
    s = ctx.store.slots
    waiting = (s["issued"] > s["done"]) & ~np.isin(s["rank"], list(lost))
    later = consequences(ctx, lost, hung_since_ns(ctx))
    out: list[Anomaly] = []
    for rank, (how, last_ns) in sorted(lost.items()):
        if rank in later:
            continue  # stopped after a peer had: the job's teardown
        comms = [
            c
            for c in ctx.topo.comms_of(rank) or s["comm"][s["rank"] == rank].tolist()
            if bool((waiting & (s["comm"] == c)).any())
        ]
        if not comms:
            continue
        out.append(
            new_anomaly(
                ctx,
                "silence",
                f"{rank}",
                FaultKind.HANG,
                tuple(sorted(comms)),
                (rank,),
                last_ns,
                now_ns,
                f"rank {rank} stopped reporting ({how}) while peers wait",
            )
        )
    return out


def _signed_size(rows: np.ndarray) -> np.ndarray:
    """Return each row's size as its signature holds it: 0 where the op's
    members may legitimately differ in size."""
    out: np.ndarray = np.where(sizes_may_differ(rows["kind"]), 0, rows["bytes"])
    return out


def _signature_text(kind: int, nbytes: int) -> str:
    name = OP_NAMES[kind] if kind < len(OP_NAMES) else str(kind)
    if sizes_may_differ(np.array([kind]))[0]:
        return f"{name}/per-rank sizes"
    return f"{name}/{nbytes}B"


def detect_mismatch(
    ctx: DetectContext, now_ns: int, done_rows: np.ndarray
) -> list[Anomaly]:
    """Return a MISMATCH anomaly per (comm, seq) whose members disagree.

    Signatures (op kind, bytes) come from in-flight op rows and from
    ``done_rows``, the completion rows of ops still partial or completed in
    disagreement (``CompletionTracker.signature_rows``); the two sides of a
    point-to-point transfer (send / recv) agree. An op whose members' sizes
    may differ (``SizeRule.PER_RANK``: an all-to-all) signs with its kind
    alone. Only ops with two signatures leave numpy.
    """
    ops = ctx.store.in_flight_ops()
    cols = [
        np.concatenate([ops[f].astype(np.uint64), done_rows[f].astype(np.uint64)])
        for f in ("comm", "seq", "rank")
    ]
    kinds = [matching_kind(ops["kind"]), matching_kind(done_rows["kind"])]
    sizes = [_signed_size(ops), _signed_size(done_rows)]
    comm, seq, rank = cols
    kind = np.concatenate(kinds).astype(np.uint64)
    size = np.concatenate(sizes).astype(np.uint64)
    if not len(comm):
        return []
    order = np.lexsort((rank, size, kind, seq, comm))
    comm, seq, kind, size, rank = (a[order] for a in (comm, seq, kind, size, rank))
    new_key = run_starts(comm, seq)
    new_sig = run_starts(comm, seq, kind, size)
    key_of = np.cumsum(new_key) - 1
    sigs_per_key = np.bincount(key_of[new_sig], minlength=int(key_of[-1]) + 1)
    odd_rows = np.flatnonzero(sigs_per_key[key_of] > 1)
    sigs: dict[tuple[int, int], dict[tuple[int, int], list[int]]] = {}
    for c, q, k, b, r in zip(
        *(a[odd_rows].tolist() for a in (comm, seq, kind, size, rank)), strict=True
    ):
        lst = sigs.setdefault((c, q), {}).setdefault((k, b), [])
        if not lst or lst[-1] != r:  # sorted by rank: a repeat is adjacent
            lst.append(r)
    out: list[Anomaly] = []
    for (c, q), by_sig in sigs.items():
        ordered = sorted(by_sig.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        odd = tuple(sorted(r for _, rs in ordered[1:] for r in rs))
        desc = "; ".join(
            f"{_signature_text(k, b)}: {rs}" for (k, b), rs in ordered
        )
        out.append(
            new_anomaly(
                ctx,
                "mismatch",
                f"{comm_hex(c)}:{q}",
                FaultKind.MISMATCH,
                (c,),
                odd,
                now_ns,
                now_ns,
                f"comm {comm_hex(c)} seq {q} disagrees: {desc}",
            )
        )
    return out
