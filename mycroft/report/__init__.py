"""Incident reports: an HTML page with PNG figures for each incident.

``mycroft analyze TRACE --report DIR`` and ``mycroft incidents show ID
--report DIR`` write ``DIR/index.html`` and the figures beside it; the folder
opens offline. Every figure is a function of the job's raw records (state
and completion batches, topology) and of the root-cause and anomaly records
the analyzer produced, never of how a fault was injected:

* progress: a rank x time heatmap, 4 s before the onset to 2 s after the
  root cause, of the chunks (flow ``done`` counters plus completed ops'
  chunks) each rank moved per 200 ms over its own mean before the onset.
  Ranks that stopped or slowed first turn dark first; grey: no report. The
  best culprit's ranks are marked.
* flows: the best culprit's send flows (``rank -> peer`` on its channel for
  a link or NIC culprit, else all the rank's sends): cumulative G/T/D chunks
  over time and the G-T and T-D backlogs, where a NIC or link fault shows.
* chain: the wait-for chain of the root cause's evidence (rank -> the rank
  it waits on, data or control) as a small graph, culprit red; a slowdown,
  with no chain, draws its culprits' flows.
* baselines: per fired (detector, comm), up to 4, the metric the detector
  judged (op ``xfer``, ``span``, a rank's lateness, a hung comm's time
  without progress) per op from the completion and state records, the
  baseline or limit the anomaly states, and the ops that fired.

matplotlib (the ``report`` extra) is imported only to draw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from mycroft.errors import InputError
from mycroft.report.collect import Collector, IncidentData

__all__ = ["FIGURES", "IncidentData", "collect", "require_matplotlib", "write"]
from mycroft.schemas.records import Anomaly, Record, RootCause

FIGURES = ("progress", "flows", "chain", "baselines")


def require_matplotlib() -> None:
    """Fail before any work when the ``report`` extra is missing.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (the CLI names the extra).
    """
    import matplotlib  # noqa: F401, PLC0415


def collect(
    records: Iterable[Record], causes: Sequence[RootCause], anomalies: Sequence[Anomaly]
) -> list[IncidentData]:
    """One pass over raw records: each incident's figures' data."""
    collectors = [Collector(rc, anomalies) for rc in causes]
    for record in records:
        for c in collectors:
            c.add(record)
    return [c.result() for c in collectors]


def write(
    out_dir: str | Path,
    incidents: Sequence[IncidentData],
    anomalies: Sequence[Anomaly],
    title: str = "Mycroft incident report",
) -> Path:
    """Write ``index.html`` and its figures into ``out_dir``; return the page.

    Raises:
        InputError: ``out_dir`` cannot be created or written.
    """
    from mycroft.report import figures  # noqa: PLC0415 - matplotlib only here
    from mycroft.report.page import page, section  # noqa: PLC0415
    from mycroft.report.wait_chain import chain_of  # noqa: PLC0415

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create report folder {out}: {exc.strerror}") from exc
    by_id = {a.anomaly_id: a for a in anomalies}
    sections = []
    for n, data in enumerate(incidents, 1):
        names = {key: f"incident{n}-{key}.png" for key in FIGURES}
        figures.progress_heatmap(data, out / names["progress"])
        if not figures.culprit_flows(data, out / names["flows"]):
            del names["flows"]  # no chunk moved on the culprit's flows
        figures.wait_graph(data, chain_of(data.rc), out / names["chain"])
        figures.baselines(data, out / names["baselines"])
        cited = [by_id[a] for a in data.rc.anomaly_ids if a in by_id]
        sections.append(section(data, names, cited))
    index = out / "index.html"
    index.write_text(page(title, sections), encoding="utf-8")
    return index
