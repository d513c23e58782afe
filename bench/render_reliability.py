"""RESULTS.md sections for the reliability benchmarks: live verdicts against
offline ones, and the load one stream worker carries."""

from __future__ import annotations

from typing import Any

_MODES = {
    "speed1": "replay at the recorded pace",
    "speed4": "replay 4x faster",
    "fast": "replay as fast as possible",
    "outage": "agents replaying while the broker is stopped (spool, then replay)",
    "kill": "worker killed with SIGKILL and restarted",
    "stop": "worker stopped with SIGTERM (graceful) and restarted",
}


def _equality(r: dict[str, Any]) -> list[str]:
    setting = r.get("setting", "default")
    shape = "" if setting == "default" else f" (`{setting}` of campaign_general.py)"
    lines = [
        f"{r['ranks']}-rank simulated jobs{shape}, {r['duration_s']:g} s each, the "
        "command's fault types x seeds plus healthy runs, one job id per mode; "
        f"{r['concurrency']} jobs at a time on one real worker. A run is *equal* "
        "when the live root causes (latest revision of each incident: id, kind, "
        "every culprit's rank, component and kind) are exactly those of "
        "`mycroft analyze` on the same records; *same culprits* compares each "
        f"incident's best culprit only. Measured at {r['commit']}, "
        f"{r['wall_s']} s.",
        "",
        "| mode | how the records reach the worker | runs | equal | same culprits "
        "| healthy runs | false root causes live | disturbances |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in r["summary"].items():
        lines.append(
            f"| {mode} | {_MODES.get(mode, mode)} | {s['runs']} | {s['equal']} "
            f"| {s['same_culprits']} | {s['healthy_runs']} "
            f"| {s['false_root_causes_live']} | {s['disturbances']} |"
        )
    differ = [x for x in r["rows"] if not x["equal"]]
    if differ:
        lines += ["", "Runs that differ:", ""]
        lines += [
            f"- {x['mode']} {x['job']}: live {x['live']}, offline {x['offline']}"
            + _ids(x)
            + ("" if x.get("caught_up", True) else " (the worker had not caught up)")
            for x in differ
        ]
    return lines


def _ids(x: dict[str, Any]) -> str:
    """The incident ids, when they are all that differs."""
    if x["live"] != x["offline"] or "live_full" not in x:
        return ""
    live = [i[0] for i in x["live_full"]]
    offline = [i[0] for i in x["offline_full"]]
    return f" (the incident ids differ: live {live}, offline {offline})"


def _lag(step: dict[str, Any]) -> str:
    return ", ".join(
        f"{w['worst_lag_s']} s (second half {w['worst_lag_second_half_s']} s, "
        f"{w['jobs_held_max']} jobs{_block(w)})"
        for w in step["workers"]
    )


def _block(w: dict[str, Any]) -> str:
    """The longest event the worker handled (per stats interval: p99 / max)."""
    if w.get("longest_event_s") is None:
        return ""
    return (
        f"; longest event p99 {w['longest_event_p99_of_intervals_s']} s, "
        f"max {w['longest_event_s']} s"
    )


def _saturation(r: dict[str, Any]) -> list[str]:
    lines = [
        f"Healthy {r['ranks']}-rank jobs of {r['duration_s']:g} s replayed at "
        "their pace, more at once each step; worst record lag of the worker "
        "(processing time minus broker time, per 2 s). Saturation: the largest "
        f"step whose lag stays under {r['lag_limit_s']} s. Measured at "
        f"{r['commit']}, {r['wall_s']} s"
        + (
            f", load average {r['load_avg_1m_start']} at the start and "
            f"{r['load_avg_1m_end']} at the end (2 CPUs)."
            if "load_avg_1m_start" in r
            else "."
        ),
        "",
        "| jobs at once | worst lag per worker | verdicts equal to offline |",
        "|---|---|---|",
    ]
    lines += [
        f"| {s['jobs']} | {_lag(s)} | {s['equal']} of {s['jobs']} |" for s in r["ramp"]
    ]
    sat = r["saturation_jobs"]
    lines += ["", f"**One worker carries {sat} concurrent jobs** under the limit.", ""]
    for key, what in (("overload", "one worker"), ("two_workers", "two workers")):
        s = r.get(key)
        if s is None:
            continue
        lines.append(
            f"- {s['jobs']} jobs (one in four faulty) on {what}: worst lag "
            f"{_lag(s)}; verdicts equal to offline in {s['equal']} of {s['jobs']}; "
            f"{s['false_root_causes']} false root causes on healthy jobs; caught "
            f"up {s['caught_up_after_s']} s after the jobs ended."
        )
    return lines


RENDERERS = {
    "verdict_equality": (
        "Live verdicts against mycroft analyze (replay speeds, outages, kills)",
        "python bench/verdict_equality.py --seeds 3 --healthy-runs 2",
        _equality,
    ),
    "verdict_equality_restarts": (
        "Live verdicts against mycroft analyze after worker kills and stops (rerun)",
        "python bench/verdict_equality.py --seeds 3 --healthy-runs 2 "
        "--modes kill,stop --out bench/results/verdict_equality_restarts.json",
        _equality,
    ),
    "verdict_equality_wire": (
        "Live verdicts against mycroft analyze where only the wire check fires",
        "python bench/verdict_equality.py --setting 1f1b-2x4x4-h4-slots --seeds 2 "
        "--first-seed 1 --faults net-background-traffic --healthy-runs 1 "
        "--duration 24 --modes speed4,fast --concurrency 2 "
        "--out bench/results/verdict_equality_wire.json (1F1B, slot counters: "
        "background traffic on a host's uplink slows no op; only `slow_wire` "
        "opens the incident)",
        _equality,
    ),
    "verdict_equality_nccl": (
        "Live verdicts against mycroft analyze on the NCCL-observable counters",
        "python bench/verdict_equality.py --setting 1f1b-2x4x4-h4-nccl --seeds 1 "
        "--first-seed 1 --faults proxy-delay,gpu-hang,nic-bandwidth --healthy-runs 1 "
        "--modes speed1,fast --concurrency 4 "
        "--out bench/results/verdict_equality_nccl.json (send G <= T+1 and the "
        "ready-wait time, as the NCCL plugin reports them)",
        _equality,
    ),
    "worker_saturation_loaded": (
        "Stream worker overload, rerun on a loaded machine (64-rank jobs)",
        "python bench/worker_saturation.py --ramp 2,4,6,8,10 --duration 30 "
        "--out bench/results/worker_saturation_loaded.json, while two offline "
        "campaigns (one process each) shared the 2 cores: saturation and lag "
        "are not comparable with the quiet run above, the longest event is an "
        "upper bound",
        _saturation,
    ),
    "worker_saturation": (
        "Stream worker saturation and overload (64-rank jobs)",
        "python bench/worker_saturation.py",
        _saturation,
    ),
}
