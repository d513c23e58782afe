"""RESULTS.md sections for the indep-world campaign (``bench/campaign_indep.py``):
one section per half, its summary and one line per run."""

from __future__ import annotations

from typing import Any


def _pct(ok: int, n: int) -> str:
    return f"{ok}/{n} ({100 * ok / n:.0f} %)" if n else "-"


def _summary(s: dict[str, Any]) -> list[str]:
    n = s["fault_runs"]
    return [
        "| fault runs | culprit | component | false root causes, healthy runs | "
        "incidents before onset (runs) | detection p50 / p90 (s) |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {n} | {_pct(s['culprit_ok'], n)} | {_pct(s['component_ok'], n)} | "
        f"{s['false_root_causes_healthy']} on {s['healthy_runs']} | "
        f"{s['pre_onset_incidents']} ({len(s['fault_runs_with_pre_onset'])}) | "
        f"{s['detection_p50_s']} / {s['detection_p90_s']} |",
    ]


def _run(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"| {r['name']} | | ERROR {r['error'][:80]} | | |"
    if r.get("healthy"):
        named = ", ".join(f"r{x[0]} {x[1]}" for x in r.get("named", []))
        return f"| {r['name']} | healthy | {named or '-'} | | |"
    ok = "ok" if r.get("culprit_ok") and r.get("component_ok") else "miss"
    lat = r.get("latency_s")
    return (
        f"| {r['name']} | r{r['truth_rank']} {r['truth_component']} | "
        f"r{r.get('rank')} {r.get('component')}/{r.get('kind')} ({ok}) | "
        f"{'-' if lat is None else f'{lat:.2f}'} | {r.get('pre_onset_incidents', 0)} |"
    )


def _half(r: dict[str, Any]) -> list[str]:
    lines = [
        f"Half `{r['half']}` of the indep world (`../shared/worlds/indep`): "
        "report = its scenarios.tsv, tune = other seeds and drawn shapes. "
        f"Source {r['commit']}, wall {r['wall_s']} s, command `{r['command']}`.",
        "",
        *_summary(r["summary"]),
        "",
        "| run | truth | named (top-1) | latency (s) | pre-onset |",
        "|---|---|---|---:|---:|",
    ]
    return lines + [_run(x) for x in r["rows"]]


RENDERERS = {
    f"campaign_indep_{half}": (
        f"Indep world campaign: {half} half",
        f"python bench/campaign_indep.py --half {half}",
        _half,
    )
    for half in ("tune", "report")
}
