"""RESULTS.md section for the Ctrl-C benchmark (``bench/ctrl_c.py``)."""

from __future__ import annotations

from typing import Any


def _took(row: dict[str, Any]) -> str:
    if "error" in row:
        return row["error"]
    if "exit_s" in row:
        return f"exited by itself after {row['exit_s']} s"
    return f"{row['stop_s']} s after Ctrl-C ({row['ran_s']} s in)"


def _ctrl_c(r: dict[str, Any]) -> list[str]:
    rows = r["cases"]
    ok = sum(1 for row in rows if row.get("ok"))
    lines = [
        f"Each long-running command started in a session of its own and sent "
        f"SIGINT to its whole process group, as a terminal's Ctrl-C does: one "
        f"at a time on a live local broker; all at once on a broker that then "
        f"stopped; and pointed at an address nobody serves (where a command "
        f"must exit by itself with code 5). Goal: exit within {r['goal_s']:g} s "
        f"with code 130 and no traceback. {ok} of {len(rows)} met it. "
        f"Measured at {r['commit']} on {r['machine']['cpus']} CPUs.",
        "",
        "| command | Kafka | exit | code | traceback | goal met |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| `{row['name']}` | {row['when']} | {_took(row)} | "
            f"{row.get('rc', '-')} | {'yes' if row.get('traceback') else 'no'} | "
            f"{'yes' if row.get('ok') else 'NO'} |"
        )
    return lines


RENDERERS = {
    "ctrl_c": (
        "Ctrl-C: every long-running command stops within 2 s",
        "python bench/ctrl_c.py",
        _ctrl_c,
    ),
}
