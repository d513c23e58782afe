"""Transfers slowed on the wire: an anomaly from wire timing alone.

Traffic the job does not own (another job's, a storage sync, a backup)
sharing a host's uplink stretches every transfer through it, yet the job's
ops may not slow: its pipeline bubbles and compute hide a millisecond per
step. The wire timing (``transfer_times``) sees it directly: each pair's
time per chunk on the wire against its own past.

Every ``wire_check_s`` of event time the job's timed transfers that started
in the last ``wire_window_s`` are compared with those that ended before
(:func:`~.transfer_times.pair_changes`, the job's median slowdown taken
out), and the parts the slowed pairs share are scored as root cause scores
them (:func:`~.transfer_times.slow_parts`). A part whose log-likelihood
ratio reaches ``wire_alarm_llr`` over at least two slowed pairs, in
``wire_persist`` checks in a row, is a slowdown of its ranks; the anomaly
keeps its id while the part stays slowed, and stops when it does. Its onset
is the first check that found the part slowed: the change happened in the
window before, and every transfer after it is slowed. (The window's start
would be up to ``wire_window_s`` early, and when the anomaly joins an
incident other detectors opened it widens the root cause's window to
before the fault: on the tune half a slow GPU was named by its host's
flow gaps then.)
"""

from __future__ import annotations

from mycroft.schemas.records import Anomaly
from mycroft.schemas.vocab import FaultKind
from mycroft.streams.core.detect import DetectContext, new_anomaly
from mycroft.streams.core.transfer_times import (
    PartKey,
    Scope,
    SlowPart,
    alarm_parts,
    pair_changes,
)


def detect_slow_wire(ctx: DetectContext, now_ns: int) -> list[Anomaly]:
    """Return a SLOWDOWN anomaly per part whose transfers stay slowed on the
    wire (module docstring); nothing between checks."""
    cfg = ctx.cfg
    watch = ctx.store.wire
    check = now_ns // int(cfg.wire_check_s * 1e9)
    if check == watch.last_check:
        return []
    watch.last_check = check
    since = now_ns - int(cfg.wire_window_s * 1e9)
    flagged = {_key(p): p for p in _slowed_parts(ctx, since)}
    # A part keeps its first onset while it stays flagged check after check.
    streak: dict[PartKey, tuple[int, int]] = {}
    for key in flagged:
        onset, run = watch.streak.get(key, (now_ns, 0))
        streak[key] = (onset, run + 1)
    watch.streak = streak
    out: list[Anomaly] = []
    for key, part in sorted(flagged.items()):
        onset, run = watch.streak[key]
        if run >= cfg.wire_persist:
            out.append(_anomaly(ctx, part, onset, now_ns))
    return out


def _slowed_parts(ctx: DetectContext, since_ns: int) -> list[SlowPart]:
    """The parts that best explain the pairs slowed since ``since_ns``, when
    they explain two or more beyond ``wire_alarm_llr``."""
    rows = ctx.store.transfers.kept()
    if not len(rows):
        return []
    top = int(max(rows["rank"].max(), rows["peer"].max())) + 1
    nic_of, host_of = ctx.topo.part_ids(top)
    rca = ctx.cfg.rca
    pairs = pair_changes(rows, since_ns, rca)
    return alarm_parts(pairs, nic_of, host_of, rca, ctx.cfg.wire_alarm_llr)


def _key(part: SlowPart) -> PartKey:
    return (part.scope.value, part.side.value, part.key)


def _anomaly(ctx: DetectContext, part: SlowPart, onset_ns: int, now_ns: int) -> Anomaly:
    ranks = tuple(sorted(part.ranks))
    comms = sorted({c for r in ranks for c in ctx.topo.comms_of(r)})
    where = "rank" if part.scope is Scope.RANK else f"{part.scope.value} {part.key}"
    return new_anomaly(
        ctx,
        "slow_wire",
        f"{part.scope.value}{part.key}:{part.side.value}:{onset_ns}",
        FaultKind.SLOWDOWN,
        tuple(comms),
        ranks,
        onset_ns,
        now_ns,
        f"{part.slowed} of {part.slowed + part.clean} transfers through {where} "
        f"(ranks {', '.join(map(str, ranks))}, {part.side.value}) take longer on "
        f"the wire than before, beyond the job's change (log-likelihood "
        f"{part.llr:.1f})",
        score=part.llr / ctx.cfg.wire_alarm_llr,
    )
