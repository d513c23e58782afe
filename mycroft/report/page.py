"""The report's HTML: one self-contained page, figures as PNGs beside it.

No script, font or style sheet from elsewhere: the folder opens offline.
"""

from __future__ import annotations

from html import escape

from mycroft.incident_text import culprit_line, iso
from mycroft.report.anomaly_values import Fired
from mycroft.report.collect import IncidentData
from mycroft.schemas.records import Anomaly, RootCause
from mycroft.verdict import (
    CONFIDENCE_NOTE,
    Placement,
    headline,
    next_step,
    nowhere,
    short_id,
    unique,
)

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-top: 1px solid #ccc;
padding-top: 12px; } table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left;
vertical-align: top; } figure { margin: 16px 0; } img { max-width: 100%;
border: 1px solid #eee; } figcaption { font-size: 13px; color: #444; }
.culprit { color: #d62728; font-weight: bold; } li { font-size: 13px; }
.answer { background: #fff6f0; border-left: 4px solid #d62728; padding: 8px 14px;
margin: 8px 0 16px; } .answer .headline { font-size: 17px; font-weight: bold; }
.answer p { margin: 6px 0; } .note { font-size: 12px; color: #555; }
"""

CAPTIONS = {
    "progress": "Chunks each rank moved per 200 ms, over the rank's own mean "
    "before the onset: the ranks that stopped or slowed first turn dark first. "
    "The culprit's ranks are marked in red.",
    "flows": "The culprit's flow both ways (a link's two ends; a rank's sends "
    "and receives): chunks the GPU made ready (G), the proxy transmitted (T) "
    "and the network completed (D), cumulative over ops; below, the backlogs "
    "G - T (ready, not sent) and T - D (sent, not done).",
    "chain": "The wait-for chain the root cause followed: an arrow points from "
    "a rank to the rank it waits on; data waits follow flows, control waits an "
    "op a peer never issued. A slowdown has no chain: its culprit flows are drawn.",
    "baselines": "The latency baselines the incident's anomalies fired on: "
    "the metric per op (or a comm's time without progress) from the records, "
    "the baseline or limit the detector held it against, the ops that fired.",
}


def _rows(cells: list[list[str]], head: list[str] | None = None) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head or [])
    body = "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in cells
    )
    return f"<table>{f'<tr>{th}</tr>' if th else ''}{body}</table>"


def answer(rc: RootCause, placement: Placement = nowhere) -> str:
    """The headline, the next step and what the confidence means."""
    parts = [f'<p class="headline">{escape(headline(rc, placement))}</p>']
    if rc.culprits:
        step = escape(next_step(rc.culprits[0], placement))
        parts.append(f"<p><b>Next step:</b> {step}</p>")
        if rc.culprits[0].reason:
            parts.append(f"<p><b>Why:</b> {escape(rc.culprits[0].reason)}</p>")
    parts.append(f'<p class="note">{escape(CONFIDENCE_NOTE)}</p>')
    return '<div class="answer">' + "".join(parts) + "</div>"


def _fired_row(f: Fired) -> list[str]:
    unit = "ms" if f.unit == "s" else f.unit
    scale = 1e3 if f.unit == "s" else 1.0
    return [
        escape(f.detector), escape(f.label),
        f"{f.value * scale:.1f} {unit}", f"{f.baseline * scale:.1f} {unit}",
        f"{f.score:.2f}", str(f.count),
    ]  # fmt: skip


def section(data: IncidentData, figures: dict[str, str], cited: list[Anomaly]) -> str:
    """One incident: the answer (headline, next step), its facts, culprits,
    figures, evidence (each line once), anomalies."""
    rc = data.rc
    detected = f"{rc.detection_latency_s:.2f} s after onset"
    resolved = f"{rc.rca_latency_s:.2f} s after detection"
    sid = short_id(rc.incident_id)
    facts = [
        [
            "incident",
            f'<code title="{escape(rc.incident_id)}">{escape(sid)}</code>'
            f" (mycroft incidents show {escape(sid)})",
        ],
        ["job", escape(rc.job_id)],
        ["kind", escape(rc.kind.value)],
        ["onset", iso(rc.onset_ns)],
        ["detected", f"{iso(rc.detected_ns)} ({detected})"],
        ["root cause", f"{iso(rc.resolved_ns)} ({resolved})"],
        ["revision", str(rc.revision)],
    ]
    culprits = [
        [f'<span class="{"culprit" if i == 0 else ""}">{escape(line)}</span>']
        for i, line in enumerate(culprit_line(c) for c in rc.culprits)
    ] or [["none named"]]
    parts = [
        f"<h2>{escape(rc.kind.value)} in job {escape(rc.job_id)}, incident "
        f"{escape(sid)}</h2>",
        answer(rc, data.places.get),
        _rows(facts),
        "<h3>culprits, best first</h3>",
        _rows(culprits, ["culprit: component (confidence) why"]),
    ]
    for key, name in figures.items():
        parts.append(
            f'<figure><img src="{escape(name)}" alt="{escape(key)}">'
            f"<figcaption>{escape(CAPTIONS[key])}</figcaption></figure>"
        )
    if data.fired:
        head = ["detector", "what", "worst", "baseline / limit", "ratio", "anomalies"]
        rows = [_fired_row(f) for f in data.fired]
        parts += ["<h3>baselines that fired</h3>", _rows(rows, head)]
    if rc.evidence:
        facts_once = unique(e.fact for e in rc.evidence)
        items = "".join(f"<li>{escape(fact)}</li>" for fact in facts_once)
        parts.append(f"<h3>evidence</h3><ol>{items}</ol>")
    if cited:
        rows = [
            [iso(a.detected_ns), escape(a.detector), escape(a.summary)] for a in cited
        ]
        parts += [
            "<h3>anomalies cited</h3>",
            _rows(rows, ["detected", "detector", "summary"]),
        ]
    return "\n".join(parts)


def page(title: str, sections: list[str]) -> str:
    """The whole document."""
    body = "\n".join(sections) or "<p>No incident: Mycroft found no root cause.</p>"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{escape(title)}</h1>\n{body}\n</body></html>\n"
    )
