"""Detectors: pure functions from progress state to ``Anomaly`` values.

* hang: a communicator has work in flight and no counter of any member moved
  for longer than an adaptive threshold (a multiple of its healthy op span).
* silence: a host whose batches stop, or a rank whose rows vanish or whose
  ``seen_ns`` goes stale while its host still reports, and peers wait on it.
* slowdown (``detect_slow``): a completed collective leaves the robust band
  of its baseline (transfer time, per-rank late arrival; a severe span), or
  its send flows to other hosts keep a transmitted-not-done lag (T-D) above
  their role's.
* mismatch: members disagree on op kind or size at one ``(comm, seq)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mycroft.schemas.records import Anomaly
from mycroft.schemas.vocab import OP_NAMES, FaultKind
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.completions import matching_kind
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.progress import ProgressStore
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
    first = np.flatnonzero(np.r_[True, comm_sorted[1:] != comm_sorted[:-1]])
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


def detect_hangs(ctx: DetectContext, now_ns: int) -> list[Anomaly]:
    """Return a HANG anomaly per busy comm whose progress stopped too long."""
    out: list[Anomaly] = []
    shortest = ctx.cfg.hang_min_s * 1e9  # no threshold is below it
    for comm, (last, tick, busy) in comm_last_progress(ctx.store).items():
        if not busy or last <= 0 or tick - last <= shortest:
            continue
        stall = tick - last
        limit = hang_threshold_ns(ctx, comm)
        if stall <= limit:
            continue
        s = ctx.store.slots
        m = (s["comm"] == comm) & (s["issued"] > s["done"])
        ranks = tuple(sorted(set(s["rank"][m].tolist())))
        frontier = int(s["done"][s["comm"] == comm].min()) + 1
        out.append(
            new_anomaly(
                ctx,
                "hang",
                f"{comm:x}:{frontier}",
                FaultKind.HANG,
                (comm,),
                ranks,
                last,
                now_ns,
                f"comm {comm:x} made no progress for {stall / 1e9:.2f} s "
                f"(limit {limit / 1e9:.2f} s) at seq {frontier}",
                score=stall / max(limit, 1),
            )
        )
    return out


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
    host_tick = store.host_tick_of_slots()
    for i in range(len(s)):
        hs = hosts[int(s["host"][i])]
        limit = _silence_limit_ns(cfg, hs.gap_ns)
        rank = int(s["rank"][i])
        if hs.index not in fresh_hosts:
            out[rank] = ("host", int(s["tick_ns"][i]))
        elif host_tick[i] - s["tick_ns"][i] > limit:
            out.setdefault(rank, ("rows", int(s["tick_ns"][i])))
        elif s["seen_ns"][i] > 0 and s["tick_ns"][i] - s["seen_ns"][i] > limit:
            out.setdefault(rank, ("seen", int(s["seen_ns"][i])))
    return out


def detect_silence(ctx: DetectContext, now_ns: int) -> list[Anomaly]:
    """Return a HANG anomaly per lost rank whose live peers wait on it."""
    lost = lost_ranks(ctx, now_ns)
    if not lost:
        return []
    s = ctx.store.slots
    waiting = (s["issued"] > s["done"]) & ~np.isin(s["rank"], list(lost))
    out: list[Anomaly] = []
    for rank, (how, last_ns) in sorted(lost.items()):
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


def detect_mismatch(
    ctx: DetectContext,
    now_ns: int,
    done_sigs: dict[tuple[int, int], dict[tuple[int, int], list[int]]],
) -> list[Anomaly]:
    """Return a MISMATCH anomaly per (comm, seq) whose members disagree.

    Signatures (op kind, bytes) come from in-flight op rows and completions;
    the two sides of a point-to-point transfer (send / recv) agree.
    """
    ops = ctx.store.in_flight_ops()
    sigs: dict[tuple[int, int], dict[tuple[int, int], list[int]]] = {}
    if len(ops):
        cols = np.stack(
            [
                ops["comm"].astype(np.uint64),
                ops["seq"].astype(np.uint64),
                matching_kind(ops["kind"]).astype(np.uint64),
                ops["bytes"].astype(np.uint64),
            ],
            1,
        )
        uniq, inv = np.unique(cols, axis=0, return_inverse=True)
        inv = inv.ravel()
        for i, (comm, seq, kind, nbytes) in enumerate(uniq.tolist()):
            ranks = sorted(set(ops["rank"][inv == i].tolist()))
            sigs.setdefault((comm, seq), {})[(kind, nbytes)] = ranks
    for key, by_sig in done_sigs.items():
        if len(by_sig) < 2 and key not in sigs:
            continue  # one signature and nothing in flight: agrees
        for sig, ranks in by_sig.items():
            lst = sigs.setdefault(key, {}).setdefault(sig, [])
            lst.extend(r for r in ranks if r not in lst)
    out: list[Anomaly] = []
    for (comm, seq), by_sig in sigs.items():
        if len(by_sig) < 2:
            continue
        ordered = sorted(by_sig.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        odd = tuple(sorted(r for _, rs in ordered[1:] for r in rs))
        desc = "; ".join(
            f"{OP_NAMES[k] if k < len(OP_NAMES) else k}/{b}B: {rs}"
            for (k, b), rs in ordered
        )
        out.append(
            new_anomaly(
                ctx,
                "mismatch",
                f"{comm:x}:{seq}",
                FaultKind.MISMATCH,
                (comm,),
                odd,
                now_ns,
                now_ns,
                f"comm {comm:x} seq {seq} disagrees: {desc}",
            )
        )
    return out
