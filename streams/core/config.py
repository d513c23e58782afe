"""Detector thresholds and windows: one frozen dataclass handed in by the edge."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mycroft.streams.core.rca_config import (
    RcaConfig,
    parse_value,
    rca_with_overrides,
)
from mycroft.streams.core.scoring import PEERS


@dataclass(frozen=True)
class DetectorConfig:
    """Every tunable of the core, in SI-suffixed units.

    Thresholds are *floors and multipliers* around adaptive baselines, never
    the whole rule: a detector fires when a value leaves the robust band of its
    own baseline *and* clears the floor.

    Attributes:
        hang_min_s: Shortest no-progress time that may count as a hang; sits
            above one proxy hiccup (~1 s) so a stall that resumes is a slowdown.
        hang_max_s: Longest adaptive hang threshold, whatever the baseline says.
        hang_span_mult: Hang threshold as a multiple of the comm's baseline op
            span (slowest healthy op, PP bubbles and late arrivals included).
        rhythm_min_s: Shortest stall of a busy comm that ``stall_rhythm``
            remembers once it resolves: below it is op jitter and pipeline
            bubbles, far from any hang threshold.
        rhythm_mult: A stall of a comm and holder set that paused before and
            resolved is a recurring pause, not a hang, up to this multiple of
            the longest earlier pause: a checkpoint's pause varies with the
            storage it writes to, not tenfold. Past it, it is a hang.
        rhythm_keep: Resolved pauses kept per comm and holder set (the bound
            and the cost report read them): a job's last few dozen pauses.
        silence_min_s: Shortest gap after which a host or rank that stopped
            reporting counts as lost.
        silence_tick_mult: Silence threshold in host reporting intervals.
        escalation_lead_s: A lost rank whose last sign of life came this much
            (plus one host reporting interval) after the job's first rank
            stopped is the job's teardown, not a cause (``escalation.py``):
            two ranks' stops are ordered only beyond one liveness beat
            (0.1 s) and the hosts' clock offsets.
        baseline_window: Samples kept per baseline (ring buffer).
        warmup_samples: Samples a baseline needs before it may judge.
        slow_ratio_min: A value must exceed ``median * slow_ratio_min``.
        slow_mad_k: ...and ``median + slow_mad_k * sigma`` (sigma = 1.4826 MAD).
        slow_abs_floor_s: ...and ``median + slow_abs_floor_s``.
        slow_persist: Out-of-band samples needed among the last ``slow_of``.
        slow_shift_k: A rank's lateness whose median over the last ``slow_of``
            ops exceeds ``median + slow_shift_k * sigma`` (and the ratio and
            floor) is a sustained shift, even below the single-sample band.
        slow_of: Length of the persistence window, samples.
        late_persist: Per-rank lateness needs this many out-of-band samples
            among its last ``late_of`` (its shift rule looks at as many).
            One baseline per rank and comm makes lateness the most numerous
            judge: at 1,024 ranks, healthy one-off stragglers (a few per
            thousand compute segments) met 3 of 5 by chance twice in 30
            simulated minutes. 5 of 8 is about 10^5 times rarer for the
            same straggler rate and costs a steady straggler 3 more ops.
        late_of: Length of the lateness persistence window, samples.
        severe_extra_s: One sample this far above the median fires at once...
        severe_ratio: ...when it is also this many times the median.
        late_floor_s: Smallest late arrival (issue skew) worth reporting.
        recur_need: A transfer (``xfer``) sample far out of band (at least
            ``recur_ratio`` x the median and ``recur_extra_s`` above it) fires
            when it is the ``recur_need``-th such among the last ``recur_of``
            samples of its key: an intermittent fault (a link that flaps
            every second) slows one op in several, which ``slow_persist`` of
            ``slow_of`` never sees. In a job without a pipeline the only
            cross-host traffic is a few data-parallel ops a step.
        recur_of: Length of that window, samples.
        recur_ratio: See ``recur_need``.
        recur_extra_s: See ``recur_need``.
        gap_floor_chunks: Smallest excess of a flow's counter gap (G-T or T-D,
            chunks) over its role's baseline worth reporting: counters move in
            whole chunks, so a one-chunk gap is granularity.
        gap_quantile: A counter gap is out of band only above this quantile
            of its baseline's healthy samples (times ``slow_ratio_min``):
            credit-based counters idle at 0 between bursts of posted slots,
            so the median and MAD alone call every burst a backlog.
        ready_wait_chunks: The G-T, in chunks, that a send flow's head step
            waiting ready for a whole sampling interval stands for, on
            producers that report a send's G at most T + 1 and its ready
            data's wait as time (the NCCL plugin: NCCL's proxy checks only
            its head step; ``schemas/ring.md`` §4c). Waiting a share of the
            interval stands for that share of it (``progress.held_ready``),
            so every rule that reads a G-T backlog reads the wait too. 8:
            NCCL_STEPS, the slots the proxy offers the GPU per connection,
            which a sender whose head cannot go fills while it waits; what
            the simulator's ``slots`` counters, which show every slot, report
            as G-T in the same case. Below a share of 1/16 it rounds to 0:
            ``isend`` itself takes microseconds per step.
        gap_chance_max: A flow's T-D is out of band in a root cause only when
            its count of ops above the band has a binomial tail below this at
            the healthy samples' rate above it (``link_rules._beyond_chance``):
            above 1/65, so that one op out of band counts where none of the
            baseline's 64 samples was.
        hold_min_members: Ops of at least this many members are read for a
            rank that holds its group back (``hold_back``); a pair's arrival
            order is set by its place in a pipeline schedule.
        hold_of: Ops of a comm in the window over which a rank's holds are
            summed: several training steps of a comm that runs one to ten
            ops a step, a fraction of a second of a busy one.
        hold_need: Held ops of one rank in that window needed before its
            share counts, the latest ``hold_need`` of them at the same place
            of successive steps with the rank on time in between: one late
            op is a GC pause or a hiccup, and a descheduled process holds a
            run of consecutive ops; a cause repeats (the same layer's
            backward, every step).
        hold_share_min: Share of the window's elapsed time that one rank's
            holds (beyond its usual lateness) must reach: a tenth of a
            group's time lost to one member is worth an operator's look,
            and healthy jitter spread over the members stays far below it.
        port_flap_need: Heartbeats with port events (link downed or
            recovered, port not active) within ``port_flap_window_s`` that
            make a flapping NIC an anomaly: one or two retrains are routine,
            a port that keeps failing is not.
        port_flap_window_s: See ``port_flap_need``; a few heartbeat periods.
        history_s: Seconds of flow snapshots kept per host for RCA.
        transfer_rows_per_rank: Completed network sends (one per op and
            peer) kept per rank of a job for ``SLOW_TRANSFERS``
            (``transfer_times``): a 64-rank job completes 700-900 a second,
            11-14 per rank, so the default holds ~9 s of a job's sends, the
            onset and the history before it as a verdict forms; that
            history is then kept per pair (``TransferTimes.before``) (3.5 KB
            per rank: 3.7 MB at 1,024 ranks).
        transfer_rows_min: ...and at least this many per job: in a pipeline
            only the stage boundaries send across hosts, a few a second per
            rank, and a 32-rank 1F1B job's ring sized by its ranks alone
            lost the history before an onset (229 KB).
        wire_check_s: How often the wire timing is checked for slowed parts
            (``detect_wire``), event time: each pair sends a few times a
            second, so a check a second reads new transfers of most pairs.
        wire_window_s: A check compares the transfers started in this last
            window with those ended before it: two checks' worth, so each
            pair has its ``rca.transfer_min_after`` sends in it.
        wire_alarm_llr: A part is slowed when its log-likelihood ratio
            (``rca.transfer_p_fault`` against ``rca.transfer_p_noise`` per
            pair) reaches this: log(10^4), prior odds of about one part in
            10^4 at fault per check (a 1,024-rank job has ~6,000 parts, each
            read three ways), so about five slowed pairs net of clean ones.
        wire_persist: ...in this many checks in a row: a wire burst or a
            phase's new mix of transfers lasts one or two.
        incident_quiet_s: An incident closes after this long without anomalies
            and with every comm progressing again.
        incident_max_anomalies: Anomalies published per incident; later ones
            (a hang of a large job stalls hundreds of comms) still count for
            root cause but are not sent, so one fault is not a flood.
        completion_timeout_s: A collective whose completions stay partial this
            long is dropped from the completion tracker.
        rca: Root-cause scoring: rule weights and caps (``rca_config``).
    """

    hang_min_s: float = 1.5
    hang_max_s: float = 10.0
    hang_span_mult: float = 4.0
    rhythm_min_s: float = 0.5
    rhythm_mult: float = 2.0
    rhythm_keep: int = 32
    silence_min_s: float = 1.0
    silence_tick_mult: float = 6.0
    escalation_lead_s: float = 0.2
    baseline_window: int = 64
    warmup_samples: int = 8
    slow_ratio_min: float = 1.4
    slow_mad_k: float = 6.0
    slow_abs_floor_s: float = 0.002
    slow_persist: int = 3
    slow_shift_k: float = 3.0
    slow_of: int = 5
    late_persist: int = 5
    late_of: int = 8
    severe_extra_s: float = 0.5
    severe_ratio: float = 4.0
    late_floor_s: float = 0.005
    recur_need: int = 3
    recur_of: int = 16
    recur_ratio: float = 2.5
    recur_extra_s: float = 0.02
    gap_floor_chunks: float = 1.5
    gap_quantile: float = 0.95
    gap_chance_max: float = 0.02
    ready_wait_chunks: float = 8.0
    hold_min_members: int = 3
    hold_of: int = 32
    hold_need: int = 3
    hold_share_min: float = 0.1
    port_flap_need: int = 3
    port_flap_window_s: float = 10.0
    history_s: float = 12.0
    transfer_rows_per_rank: int = 128
    transfer_rows_min: int = 8192
    wire_check_s: float = 1.0
    wire_window_s: float = 2.0
    wire_alarm_llr: float = 9.2
    wire_persist: int = 3
    incident_quiet_s: float = 5.0
    incident_max_anomalies: int = 32
    completion_timeout_s: float = 30.0
    rca: RcaConfig = field(default_factory=RcaConfig)

    def __post_init__(self) -> None:
        """Reject values no detector can work with; the error names the key."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _NON_NEGATIVE:
                if value < 0:
                    raise ValueError(f"detector {f.name} must be >= 0, got {value}")
            elif f.name != "rca" and value <= 0:
                raise ValueError(f"detector {f.name} must be > 0, got {value}")
        for name in _RATIOS:
            if getattr(self, name) < 1:
                raise ValueError(f"detector {name} is a ratio: it must be >= 1")
        for name in _FRACTIONS:
            if not getattr(self, name) < 1:
                raise ValueError(f"detector {name} is a fraction: it must be < 1")
        for need, of in _WINDOWS:
            if getattr(self, need) > getattr(self, of):
                raise ValueError(
                    f"detector {need} ({getattr(self, need)}) counts samples of "
                    f"its last {of} ({getattr(self, of)}): raise {of} or lower {need}"
                )
        if self.hang_max_s < self.hang_min_s:
            raise ValueError("detector hang_max_s must be >= hang_min_s")
        if self.hold_min_members < PEERS:
            raise ValueError("detector hold_min_members must be >= 2 (a group)")

    @property
    def history_ns(self) -> int:
        """``history_s`` in nanoseconds."""
        return int(self.history_s * 1e9)


_NON_NEGATIVE = frozenset(
    {"slow_abs_floor_s", "severe_extra_s", "late_floor_s", "recur_extra_s"}
)
"""Floors that may be 0 (off); every other value must be positive."""
_RATIOS = ("slow_ratio_min", "severe_ratio", "recur_ratio", "rhythm_mult")
_FRACTIONS = ("gap_quantile", "gap_chance_max")
_WINDOWS = (
    ("warmup_samples", "baseline_window"),
    ("slow_persist", "slow_of"),
    ("late_persist", "late_of"),
    ("recur_need", "recur_of"),
    ("hold_need", "hold_of"),
)
"""``(need, of)``: a count of samples within a window of ``of`` samples."""


def with_overrides(
    cfg: DetectorConfig, assignments: str | Sequence[str]
) -> DetectorConfig:
    """``cfg`` with ``KEY=VALUE`` overrides: one per item, or comma-separated.

    Keys ``rca.<key>`` set root-cause scoring (``rca_config.RcaConfig``):
    ``rca.hostwide_conf=0.5``, ``rca.weight.slow_compute=2``.

    Raises:
        ValueError: an unknown key, a value not of the key's type, or a
            resulting config that ``__post_init__`` rejects; the message
            says which and lists the keys.
    """
    items = [assignments] if isinstance(assignments, str) else list(assignments)
    pairs = [a.strip() for item in items for a in item.split(",") if a.strip()]
    known = {f.name: type(getattr(cfg, f.name)) for f in fields(cfg)}
    known.pop("rca")
    changes: dict[str, Any] = {}
    rca: dict[str, str] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        key = key.strip()
        if eq and key.startswith(_RCA_PREFIX):
            rca[key.removeprefix(_RCA_PREFIX)] = text
            continue
        key = key.replace("-", "_")
        if not eq or key not in known:
            raise ValueError(
                f"detector override {pair!r} is not KEY=VALUE with a key of "
                f"{', '.join(sorted(known))} or rca.<key> (streams/core/config.py)"
            )
        changes[key] = parse_value(f"detector {key}", text, known[key])
    if rca:
        changes["rca"] = rca_with_overrides(cfg.rca, rca)
    return replace(cfg, **changes)


_RCA_PREFIX = "rca."
