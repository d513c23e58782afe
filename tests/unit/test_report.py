"""Incident reports: the figures' data from simulated faulty jobs, the page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mycroft import report
from mycroft.cli import main as cli_main
from mycroft.producers.tracefile import read_records
from mycroft.report.collect import IncidentData
from mycroft.report.figures import culprit_ranks, relative_progress
from mycroft.report.wait_chain import chain_of
from mycroft.schemas.records import Anomaly, Culprit, RootCause
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.analyze import Replay

Run = tuple[Path, list[Anomaly], RootCause, IncidentData]


def simulate(tmp: Path, fault: str) -> Path:
    """A 16-rank job (4 hosts) whose fault starts 5 s into a 10 s run."""
    trace = tmp / "run.trace"
    argv = [
        "simulate", "--ranks", "16", "--tp", "4", "--pp", "2", "--dp", "2",
        "--fault", f"{fault}:at=5", "--duration", "10",
        "--out", str(trace), "--truth", str(tmp / "truth.json"),
    ]  # fmt: skip
    assert cli_main(argv) == 0
    return trace


def analyzed(trace: Path) -> Run:
    rp = Replay()
    for ts, rec in read_records(trace):
        rp.feed(ts, rec)
    anomalies, causes = rp.finish()
    (rc,) = causes.values()
    (data,) = report.collect((r for _, r in read_records(trace)), [rc], anomalies)
    return trace, anomalies, rc, data


@pytest.fixture(scope="module")
def nic_down(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return analyzed(simulate(tmp_path_factory.mktemp("nic"), "nic-down"))


@pytest.fixture(scope="module")
def slow_nic(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return analyzed(simulate(tmp_path_factory.mktemp("bw"), "nic-bandwidth"))


def _stop_bin(row: np.ndarray, first: int) -> int:
    """The bin from which a rank moved nothing until the end of the window."""
    moving = np.flatnonzero(np.nan_to_num(row[first:], nan=1.0) > 0)
    return first + (int(moving[-1]) + 1 if len(moving) else 0)


def test_the_heatmap_shows_the_culprits_stopping_first(nic_down: Run) -> None:
    _, _, rc, data = nic_down
    assert rc.culprits[0].scope == "nic"
    rel = relative_progress(data)
    edges = data.window.edges()
    onset = int((edges[1:] <= rc.onset_ns).sum())  # the first bin after it
    assert rel.shape == (16, len(edges) - 1)
    assert np.nanmean(rel[:, :onset]) == pytest.approx(1.0)
    stops = {int(r): _stop_bin(rel[i], onset - 5) for i, r in enumerate(data.ranks)}
    culprits = culprit_ranks(data)
    assert culprits == [8, 9]
    assert max(stops[r] for r in culprits) <= min(stops.values())
    assert all(stops[r] <= onset + 1 for r in culprits)
    assert all(stop < len(edges) - 1 for stop in stops.values())  # a hang


def test_the_flows_show_the_backlog_frozen_at_the_far_end(nic_down: Run) -> None:
    _, _, rc, data = nic_down
    c = rc.culprits[0]
    ch = f"channel {c.channel}"
    assert data.flow.labels == (
        f"{c.rank} -> {c.peer}, {ch}",
        f"{c.peer} -> {c.rank}, {ch}",
    )
    back = data.flow.key == 1
    t, gtd = data.flow.t_ns[back], data.flow.gtd[back]
    before, after = t < rc.onset_ns - 10**9, t > rc.detected_ns
    assert before.any() and after.any()
    assert (gtd[after, 0] > gtd[after, 1]).all()  # ready, never sent (G > T)
    assert len(set(gtd[after, 1].tolist())) == 1  # T frozen
    assert gtd[before, 1][-1] > gtd[before, 1][0]  # it moved before


def test_the_chain_ends_at_the_culprit(nic_down: Run) -> None:
    _, _, rc, _ = nic_down
    edges = chain_of(rc)
    assert {e.kind for e in edges} <= {"data", "control"}
    assert any(e.dst == rc.culprits[0].rank and e.kind == "data" for e in edges)


def test_a_slowdown_draws_its_culprit_flows_as_the_chain() -> None:
    link = Culprit(3, "h1", Component.NETWORK, FaultKind.SLOWDOWN, 0.8, peer=7,
                   channel=1, scope="link")  # fmt: skip
    rc = RootCause("j:s", 0, "j", FaultKind.SLOWDOWN, (link,), (), (), 1, 2, 3)
    (edge,) = chain_of(rc)
    assert (edge.src, edge.dst, edge.kind, edge.why) == (
        3,
        7,
        "flow",
        "network channel 1",
    )


def test_a_hang_panel_is_the_stall_crossing_its_limit(nic_down: Run) -> None:
    _, _, rc, data = nic_down
    assert data.fired and all(f.metric == "stall" for f in data.fired)
    panel = data.panels[0]
    assert panel.fired.baseline == pytest.approx(1.5)
    assert panel.hit.any()
    assert (panel.value_s[panel.hit] > panel.fired.baseline).all()
    assert (panel.value_s[panel.t_ns < rc.onset_ns] < panel.fired.baseline).all()


def test_a_slowdown_panel_is_the_metric_leaving_its_baseline(slow_nic: Run) -> None:
    _, _, rc, data = slow_nic
    assert rc.kind is FaultKind.SLOWDOWN and data.panels
    for p in data.panels:
        before = p.t_ns < rc.onset_ns
        assert before.sum() >= 3 and p.hit.any()
        assert np.median(p.value_s[before]) == pytest.approx(p.fired.baseline, rel=0.2)
        assert (p.value_s[p.hit] > 2 * p.fired.baseline).all()
        assert p.fired.value == pytest.approx(p.value_s[p.hit].max(), rel=0.05)


def test_the_page_references_every_figure_and_nothing_online(
    nic_down: Run, tmp_path: Path
) -> None:
    _, anomalies, rc, data = nic_down
    import matplotlib.image as mpimg  # noqa: PLC0415 - the report extra

    page = report.write(tmp_path / "out", [data], anomalies)
    html = page.read_text()
    names = re.findall(r'<img src="([^"]+)"', html)
    assert len(names) == len(report.FIGURES)
    for name in names:
        pixels = mpimg.imread(page.parent / name)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 200
        assert pixels[..., :3].std() > 0.05  # not a blank canvas
    assert "http://" not in html and "https://" not in html
    assert rc.culprits[0].subject() in html and rc.incident_id in html


def test_report_without_matplotlib_names_the_extra(
    nic_down: Run, tmp_path: Path
) -> None:
    trace = nic_down[0]
    script = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from mycroft.cli import main\n"
        f"argv = ['analyze', {str(trace)!r}, '--report', {str(tmp_path / 'r')!r}]\n"
        "sys.exit(main(argv))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert "'report' extra" in proc.stderr
    assert "pip install 'mycroft-trace[report]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()
