"""Score one analyzer run against its ground truth (pure; no I/O).

Inputs are the simulator's truth document (``SimResult.truth()`` / the
``--truth`` file) and the analyzer's ``mycroft analyze --json`` document
(``{"anomalies": [...], "root_causes": [...]}``; root-cause rows are grouped
by incident, incidents in detection order, each incident's best culprit
first). The analyzer never sees the truth: it is compared here, outside.

Rules (all times in trace seconds, reference clock; host clocks are off by a
few ms, hence ``TOLERANCE_S``):

* **detected**: some anomaly has ``detected_at_s >= onset_s - TOLERANCE_S``.
  ``detection_latency_s`` = first such ``detected_at_s - onset_s`` (>= 0).
* **the diagnosis** is the best culprit (``best`` row, else the first row)
  of the first incident detected at or after ``onset_s - TOLERANCE_S``. Only
  an incident's latest revision is in the JSON, so the diagnosis is that
  incident's final answer. ``rca_latency_s`` = the time its first root cause
  was produced (``first_resolved_at_s`` when the row has it, else
  ``resolved_at_s``) minus ``onset_s``; ``final_rca_latency_s`` uses
  ``resolved_at_s`` (when the scored answer appeared);
  ``rca_after_detection_s`` = ``rca_latency_s - detection_latency_s``.
* **rank correct** (top-1): the diagnosed rank equals the truth ``rank``, or
  is in the truth ``ranks`` list. ``ranks`` lists the ranks *equally
  attached* to the faulty part: the 2 GPUs sharing a NIC (nic-down,
  nic-bandwidth, link-flap), the 8 GPUs of a host (gpu-background-load,
  net-background-traffic) or of the hosts under a switch
  (switch-congestion), and the single rank otherwise. No analyzer can tell
  which GPU of a shared NIC/host "is" the fault, so any of them counts.
* **component correct**: diagnosed component == truth ``component``.
* **kind correct**: diagnosed kind == truth ``kind``.
* **flow correct** (link faults only: ``nic-down``, ``nic-bandwidth``,
  ``link-flap``, ``switch-congestion``, ``net-background-traffic``): when the
  truth gives a ``peer``, the diagnosed flow must be exactly ``rank -> peer``
  (and, when the truth names a channel in ``params``, that channel). The
  simulator's faults here carry no peer (they hit every flow leaving the
  faulty NIC/hosts), so the flow is judged correct when the diagnosis names
  a flow (``peer`` and ``channel`` not null) whose source rank is one of the
  truth ``ranks`` and whose peer is on another host (the traffic that crosses
  the faulty NIC/switch); a diagnosis without a flow is wrong. For other
  faults the flow is not scored (``None``).
* **false root causes**: every root-cause *incident* of a healthy run (no
  truth faults); on a faulty run, every incident detected before
  ``onset_s - TOLERANCE_S``. Likewise ``false_anomalies`` counts anomalies.
"""

from __future__ import annotations

from typing import Any

TOLERANCE_S = 0.05
"""Clock slack: host clocks differ from the reference by up to ~10 ms."""

LINK_FAULTS = frozenset(
    {
        "nic-down",
        "nic-bandwidth",
        "link-flap",
        "switch-congestion",
        "net-background-traffic",
    }
)
"""Faults of a network path, whose diagnosis should name a flow."""


def incidents(analysis: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Group root-cause rows by incident, preserving the document's order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in analysis.get("root_causes", []):
        out.setdefault(str(row["incident_id"]), []).append(row)
    return list(out.values())


def _best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    for r in rows:
        if r.get("best"):
            return r
    return rows[0]


def _host_of(rank: int, truth: dict[str, Any]) -> int:
    gph = int(truth.get("config", {}).get("gpus_per_host", 8))
    return rank // gph


def flow_correct(
    fault: dict[str, Any], diag: dict[str, Any], truth: dict[str, Any]
) -> bool | None:
    """Return whether the diagnosed flow is the faulty one (None: not scored)."""
    if fault["fault"] not in LINK_FAULTS:
        return None
    peer, ch = diag.get("peer"), diag.get("channel")
    if peer is None or ch is None:
        return False
    ranks = set(fault.get("ranks") or []) | (
        {fault["rank"]} if fault.get("rank") is not None else set()
    )
    if fault.get("peer") is not None:
        want_ch = (fault.get("params") or {}).get("channel")
        ok = diag["rank"] in ranks and int(peer) == int(fault["peer"])
        return ok and (want_ch is None or int(ch) == int(want_ch))
    return diag["rank"] in ranks and _host_of(int(peer), truth) != _host_of(
        int(diag["rank"]), truth
    )


def score_run(truth: dict[str, Any], analysis: dict[str, Any]) -> dict[str, Any]:
    """Score one run; see the module docstring for every rule.

    Returns:
        A flat dict: ``fault`` (name or ``"healthy"``), ``detected``,
        ``detection_latency_s``, ``rca_latency_s``, ``rca_after_detection_s``,
        ``rank_ok``, ``component_ok``, ``kind_ok``, ``flow_ok`` (None when not
        scored), ``diagnosis`` (the top culprit row or None),
        ``false_root_causes``, ``false_anomalies``.
    """
    faults = truth.get("faults", [])
    anomalies = analysis.get("anomalies", [])
    incs = incidents(analysis)
    if not faults:
        return {
            "fault": "healthy",
            "detected": False,
            "detection_latency_s": None,
            "rca_latency_s": None,
            "final_rca_latency_s": None,
            "rca_after_detection_s": None,
            "rank_ok": None,
            "component_ok": None,
            "kind_ok": None,
            "flow_ok": None,
            "diagnosis": None,
            "false_root_causes": len(incs),
            "false_anomalies": len(anomalies),
        }
    fault = min(faults, key=lambda f: f["onset_s"])
    onset = float(fault["onset_s"])
    cut = onset - TOLERANCE_S
    after = [a for a in anomalies if a["detected_at_s"] >= cut]
    det_lat = (
        max(0.0, min(a["detected_at_s"] for a in after) - onset) if after else None
    )
    post = [rows for rows in incs if _best(rows)["detected_at_s"] >= cut]
    diag = _best(post[0]) if post else None
    rca_lat = rca_after = final_lat = None
    rank_ok = comp_ok = kind_ok = flow_ok = None
    if diag is not None:
        first = diag.get("first_resolved_at_s", diag["resolved_at_s"])
        rca_lat = max(0.0, float(first) - onset)
        final_lat = max(0.0, float(diag["resolved_at_s"]) - onset)
        rca_after = max(0.0, rca_lat - (det_lat or 0.0))
        ranks = set(fault.get("ranks") or [])
        if fault.get("rank") is not None:
            ranks.add(int(fault["rank"]))
        rank_ok = int(diag["rank"]) in ranks
        comp_ok = diag["component"] == fault["component"]
        kind_ok = diag["kind"] == fault["kind"]
        flow_ok = flow_correct(fault, diag, truth)
    elif fault["fault"] in LINK_FAULTS:
        flow_ok = False
    return {
        "fault": fault["fault"],
        "detected": det_lat is not None,
        "detection_latency_s": det_lat,
        "rca_latency_s": rca_lat,
        "final_rca_latency_s": final_lat,
        "rca_after_detection_s": rca_after,
        "rank_ok": bool(rank_ok),
        "component_ok": bool(comp_ok),
        "kind_ok": bool(kind_ok),
        "flow_ok": flow_ok,
        "diagnosis": (
            {k: diag.get(k) for k in ("rank", "peer", "channel", "component", "kind")}
            | {"confidence": diag.get("confidence"), "reason": diag.get("reason")}
            if diag is not None
            else None
        ),
        "false_root_causes": len(incs) - len(post),
        "false_anomalies": len(anomalies) - len(after),
    }
