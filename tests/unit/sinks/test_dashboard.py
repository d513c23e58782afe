"""The Grafana dashboard is valid JSON and queries only metrics the sink defines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mycroft.sinks.lag import METRIC_NAMES as LAG_METRIC_NAMES
from mycroft.sinks.prometheus import METRIC_NAMES

DASHBOARD = Path(__file__).parents[3] / "infra" / "grafana" / "mycroft-dashboard.json"
FUNCTIONS = {"sum", "rate", "increase", "histogram_quantile", "vector", "by", "or",
             "label_values", "le", "job_id", "kind", "count", "max",
             "component", "on", "group_left", "group", "topic"}  # fmt: skip


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in {"expr", "definition"}]
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_every_expr_uses_only_sink_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text("utf-8"))
    exprs = _exprs(dashboard)
    assert len(exprs) >= 8
    allowed = set(METRIC_NAMES) | set(LAG_METRIC_NAMES) | {
        f"{n}_{s}" for n in METRIC_NAMES for s in ("bucket", "sum", "count")
    }
    used = set()
    for expr in exprs:
        bare = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]', "", expr)
        used |= {w for w in re.findall(r"[a-zA-Z_:][\w:]*", bare) if w not in FUNCTIONS}
    assert used <= allowed, used - allowed
    assert used & {"mycroft_root_cause_info", "mycroft_incidents_open"}


def test_panels_have_unique_ids_and_titles() -> None:
    panels = json.loads(DASHBOARD.read_text("utf-8"))["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    titles = " ".join(p["title"] for p in panels).lower()
    for word in (
        "open incidents",
        "culprits",
        "detection latency",
        "rca latency",
        "anomaly rate",
    ):
        assert word in titles
