"""Recurring pauses of a job as ``mycroft analyze`` reports them.

A pause that recurs with the job's own rhythm (a checkpoint, an evaluation
phase) is not an incident but a cost: who pauses, how often, for how long,
and what share of the job's time it takes (``core/stall_rhythm.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mycroft.schemas.text import comm_hex
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.stall_rhythm import PauseCost, describe

JobCosts = dict[str, list[PauseCost]]
"""job id -> its recurring pauses, costliest first."""


def job_costs(analyzers: Mapping[str, Analyzer]) -> JobCosts:
    """Each job's recurring pauses (jobs without any are left out)."""
    out = {job: an.rhythm.costs() for job, an in sorted(analyzers.items())}
    return {job: costs for job, costs in out.items() if costs}


def pauses_json(costs: JobCosts) -> list[dict[str, Any]]:
    """One row per job and holder set, for ``--json``'s ``pauses``."""
    return [
        {
            "job_id": job,
            "ranks": list(c.holders),
            "comms": [comm_hex(x) for x in c.comms],
            "count": c.count,
            "every_s": round(c.every_s, 3),
            "mean_s": round(c.mean_s, 3),
            "longest_s": round(c.longest_s, 3),
            "total_s": round(c.total_s, 3),
            "share": round(c.share, 4),
            "summary": describe(c),
        }
        for job, job_rows in costs.items()
        for c in job_rows
    ]


def pause_lines(costs: JobCosts) -> list[str]:
    """The human report's section (empty without recurring pauses)."""
    if not costs:
        return []
    lines = ["recurring pauses (the job's own rhythm, not incidents):"]
    for job, job_rows in costs.items():
        lines += [f"  {job}: {describe(c)}" for c in job_rows]
    return lines
