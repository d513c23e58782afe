"""RESULTS.md sections for the general campaign (``bench/campaign_general.py``):
the half tuned on and the half only reported, each file one section."""

from __future__ import annotations

from typing import Any

_HEAD = (
    "| half | fault runs | detected | culprit (rank) | component | detection p90 "
    "(s) | false root causes, healthy (simulated min) | before onset on fault runs |"
)


def _half(r: dict[str, Any]) -> list[str]:
    lines = [
        "Settings (schedule, layout, counter semantics, drift, noise) and seeds "
        "of each half are disjoint; the core is tuned on the tune half, and "
        "report-half runs are read only to diagnose failures, never to pick a "
        "constant. "
        f"Wall {r['wall_s']:.0f} s on {r['cpus']} CPUs, source "
        f"{r['commit']}. Command: `{r['command']}`.",
        "",
        _HEAD,
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, h in r["halves"].items():
        keys = ("detection_rate", "culprit_accuracy", "component_accuracy")
        rates = [h[k] if h["fault_runs"] else "-" for k in keys]  # healthy only
        lines.append(
            f"| {name} | {h['fault_runs']} | {' | '.join(map(str, rates))} | "
            f"{h['detection_p90_s'] or '-'} | {h['false_root_causes_healthy']} "
            f"({h['healthy_minutes']}) | {h['false_root_causes_before_onset']} |"
        )
    lines += _effective(r["halves"])
    lines += ["", "| setting | runs | culprit | component | false root causes |"]
    lines.append("|---|---:|---:|---:|---:|")
    for setting in r["per_setting"]:
        runs = [x for x in r["rows"] if x["setting"] == setting]
        faults = [x for x in runs if x["fault"] != "healthy"]
        ok = sum(bool(x["rank_ok"]) for x in faults)
        comp = sum(bool(x["component_ok"]) for x in faults)
        false = sum(x["false_root_causes"] for x in runs)
        n = len(faults)
        share = (f"{ok / n:.3f}", f"{comp / n:.3f}") if n else ("-", "-")
        lines.append(
            f"| `{setting}` | {len(runs)} | {share[0]} | {share[1]} | {false} |"
        )
    return lines + _per_fault(r["rows"])


def _effective(halves: dict[str, Any]) -> list[str]:
    """The accuracy over the fault runs that cost the job an iteration
    against its healthy twin (``bench/campaign/effect.py``), where measured."""
    lines: list[str] = []
    for name, h in halves.items():
        if not h["fault_runs"] or "effective_fault_runs" not in h:
            continue
        idle = ", ".join(f"{f} {n}" for f, n in h["no_effect_runs"].items())
        lines.append(
            f"- {name}: {h['effective_fault_runs']} of {h['fault_runs']} fault runs "
            "cost the job at least one iteration against its healthy twin; over "
            f"them, culprit {h['culprit_accuracy_effective']}, component "
            f"{h['component_accuracy_effective']}. No iteration lost: "
            f"{idle or 'none'} (counted in the table above all the same)."
        )
    return ["", *lines] if lines else []


def _per_fault(rows: list[dict[str, Any]]) -> list[str]:
    """Per fault over the settings: runs, detected, right culprit, right
    component (what a family of failures has in common shows here)."""
    faults = sorted({x["fault"] for x in rows} - {"healthy"})
    if not faults:
        return []
    lines = ["", "| fault | runs | detected | culprit | component |"]
    lines.append("|---|---:|---:|---:|---:|")
    for fault in faults:
        runs = [x for x in rows if x["fault"] == fault]
        counts = [
            sum(bool(x[k]) for x in runs)
            for k in ("detected", "rank_ok", "component_ok")
        ]
        lines.append(
            f"| {fault} | {len(runs)} | " + " | ".join(map(str, counts)) + " |"
        )
    return lines


RENDERERS = {
    "campaign_general_tune": (
        "General campaign: tune half (simulator behaviours)",
        "python bench/campaign_general.py --half tune",
        _half,
    ),
    "campaign_general_tune_seeds3": (
        "General campaign: tune half, 3 seeds of 24 s",
        "python bench/campaign_general.py --half tune --healthy-runs 1 "
        "--healthy-duration 60",
        _half,
    ),
    "campaign_general_tune_seeds4to6": (
        "General campaign: tune half, seeds 4-6 (3 more tune seeds of 24 s)",
        "python bench/campaign_general.py --half tune --seeds 3 --first-seed 4 "
        "--healthy-runs 0",
        _half,
    ),
    "campaign_general_report": (
        "General campaign: report-only half (every setting, faults and healthy)",
        "python bench/campaign_general.py --half report",
        _half,
    ),
    "campaign_general_report_seeds3": (
        "General campaign: report-only half, 3 seeds of 24 s (the script's defaults)",
        "python bench/campaign_general.py --half report --healthy-runs 0",
        _half,
    ),
    "campaign_general_report_healthy": (
        "General campaign: report-only half, 30 healthy simulated minutes",
        "python bench/campaign_general.py --half report --faults none "
        "--healthy-runs 6 --healthy-duration 60",
        _half,
    ),
}
