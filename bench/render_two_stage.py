"""RESULTS.md sections for ``bench/results/two_stage*.json``.

``two_stage.json`` comes from ``bench/two_stage.py``, ``two_stage_accuracy.json``
from ``bench/two_stage_accuracy.py``.

``bench/report.py`` merges these renderers into its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Renderer = tuple[str, str, Callable[[dict[str, Any]], list[str]]]


def _two_stage(r: dict[str, Any]) -> list[str]:
    s1 = r["stage1"]
    one, two = s1["1_worker"], s1["2_workers"]
    rows = [
        f"One simulated job of {r['ranks']} ranks, {r['trace_s']:g} s of trace "
        f"({r['rc_rows']} rank-state rows), {r['groups']} comm groups, evaluate "
        f"every {r['evaluate_s']:g} s. Stage 1 in worker processes (decode, fold, "
        "evaluate, encode summaries; no broker). "
        f"Machine: {r['machine']['cpus']} CPUs; {r['machine']['note']}.",
        "",
        "| stage 1 | rows/s (wall) | slowest worker (s) | CPU s per worker "
        "| rows per CPU s of the busiest |",
        "|---|---|---|---|---|",
    ]
    for label, x in (("1 worker", one), ("2 workers", two)):
        cpu = " / ".join(f"{c:g}" for c in x["cpu_s_per_worker"])
        rows.append(
            f"| {label} | {x['rows_per_s']} | {x['slowest_worker_s']} | {cpu} "
            f"| {x['rows_per_cpu_s_of_busiest']} |"
        )
    rows += [
        "",
        f"2 vs 1 worker: x{r['speedup_2_vs_1']} wall, x{r['speedup_2_vs_1_cpu']} "
        f"per CPU second. Stage 0 (split + encode): "
        f"{r['stage0_split_rows_per_s']} rows/s in one process.",
        "",
        "| summary bytes per tick | median | max | raw input per tick | max / raw |",
        "|---|---|---|---|---|",
    ]
    for label, z in r["summary_size"].items():
        rows.append(
            f"| {label} | {z['summary_bytes_per_tick_median']} "
            f"| {z['summary_bytes_per_tick_max']} | {z['raw_bytes_per_tick']} "
            f"| {z['ratio_max']:.2%} |"
        )
    return rows


def _accuracy(r: dict[str, Any]) -> list[str]:
    rows = [
        f"{r['ranks']} ranks ({r['shape']}), seed {r['seed']}, {r['trace_s']:g} s "
        f"per run; two-stage = split into {r['groups']} comm groups + resolver, "
        "in one process. Top culprit of the first incident's latest revision.",
        "",
        "| fault | injected | single stage | two stage |",
        "|---|---|---|---|",
    ]

    def cell(x: list[Any] | None) -> str:
        return "none" if x is None else f"{x[0]} {x[1]}"

    for f in r["faults"]:
        rows.append(
            f"| {f['fault']} | {cell(f['truth'])} | {cell(f['single_stage'])} "
            f"| {cell(f['two_stage'])} |"
        )
    return rows


RENDERERS: dict[str, Renderer] = {
    "two_stage": (
        "Two-stage worker: stage-1 throughput and summary size",
        "python bench/two_stage.py",
        _two_stage,
    ),
    "two_stage_accuracy": (
        "Two-stage vs single-stage root cause, same traces",
        "python bench/two_stage_accuracy.py",
        _accuracy,
    ),
}
