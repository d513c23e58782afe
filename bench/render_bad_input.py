"""RESULTS.md section for the bad-input benchmark (``bench/bad_input.py``)."""

from __future__ import annotations

from typing import Any


def _bad_input(r: dict[str, Any]) -> list[str]:
    a, huge = r["args"], r["huge_batch"]
    tried = sum(r["tried_per_category"].values())
    faults = ", ".join(dict.fromkeys(x["fault"] for x in r["rows"]))
    held = tried - sum(r["rejected_per_reason"].values())
    lines = [
        f"{r['runs']} simulated 64-rank runs of {a['seconds']:g} s ({faults}; "
        f"{a['seeds']} seeds each), each analysed clean and "
        f"with {a['per_category']} wrong records per category mixed in: "
        f"{tried} wrong records and {r['null_values_tried']} null values in all. "
        f"Measured at {r['commit']}.",
        "",
        "| metric | measured | goal |",
        "|---|---|---|",
        f"| crashes | {r['crashes']} | 0 |",
        f"| false root causes (healthy runs) | {r['false_root_causes']} | 0 |",
        f"| fault runs whose best culprit changed | {r['culprit_changes']} | 0 |",
        f"| culprits outside the job's ranks | {r['culprits_outside_job']} | 0 |",
        f"| longest engine call, p99 / max (s) | {r['engine_call_p99_s']} / "
        f"{r['engine_call_max_s']} | <= 0.5 |",
        f"| 250k-row state batch: encode / decode (s) | {huge['encode_s']} / "
        f"{huge['decode_s']} | - |",
        f"| 250k-row state batch amid a hang: longest engine call (s) | "
        f"{huge['max_engine_call_s']} | <= 0.5 |",
        f"| 250k-row state batch: rejected as | "
        f"{', '.join(huge['rejected']) or 'not rejected'} | too-large |",
        "",
        "| category | records tried |",
        "|---|---|",
    ]
    lines += [f"| {k} | {n} |" for k, n in r["tried_per_category"].items()]
    lines += ["", "| reason | rejections |", "|---|---|"]
    lines += [f"| {k} | {n} |" for k, n in r["rejected_per_reason"].items()]
    lines += [
        "",
        f"The other {held} wrong records (rows of a rank or comm the topology "
        "does not declare, mixed in during a run's last 5 s) were still held "
        "for their topology when the run ended: none reached state. An engine "
        "call is one `Analyzer.ingest` or `evaluate`, what a worker runs on its "
        "event loop without yielding.",
    ]
    return lines


RENDERERS = {
    "bad_input": (
        "Wrong records: crashes, false root causes, longest engine call",
        "python bench/bad_input.py --seeds 3 --per-category 20",
        _bad_input,
    ),
}
