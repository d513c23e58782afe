"""The four figures of an incident, drawn with matplotlib (Agg) to PNG.

Times are seconds from the incident's onset (trace clock); the onset, the
detection and the root cause are vertical lines on every time axis.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend comes first
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from mycroft.report.collect import BIN_NS, IncidentData  # noqa: E402
from mycroft.report.wait_chain import Edge  # noqa: E402

CULPRIT = "#d62728"
EDGE_COLOURS = {"data": "#1f77b4", "control": "#ff7f0e", "flow": CULPRIT}
DPI = 100
GTD = (("G: GPU ready", "#2ca02c"), ("T: transmitted", "#1f77b4"),
       ("D: done", "#9467bd"))  # fmt: skip


def _rel(data: IncidentData, t_ns: np.ndarray | int) -> np.ndarray:
    return (np.asarray(t_ns, np.float64) - data.rc.onset_ns) / 1e9


def _span(data: IncidentData) -> tuple[float, float]:
    """The window's ends in seconds from the onset."""
    w = data.window
    return float(_rel(data, w.start_ns)), float(_rel(data, w.end_ns))


def _marks(ax: Axes, data: IncidentData) -> None:
    rc = data.rc
    for t, style, what in (
        (rc.onset_ns, "-", "onset"),
        (rc.detected_ns, "--", "detected"),
        (rc.resolved_ns, ":", "root cause"),
    ):
        ax.axvline(float(_rel(data, t)), color="black", ls=style, lw=1, label=what)


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def culprit_ranks(data: IncidentData) -> list[int]:
    """The best culprit's ranks (a NIC's or host's several), else its rank."""
    if not data.rc.culprits:
        return []
    c = data.rc.culprits[0]
    return sorted(set(c.ranks) | {c.rank})


def relative_progress(data: IncidentData) -> np.ndarray:
    """Each rank's chunks per bin over its own mean before the onset (1:
    as before; 0: stopped; NaN: no report, or no progress before)."""
    before = data.window.edges()[1:] <= data.rc.onset_ns
    with np.errstate(invalid="ignore", divide="ignore"):
        if before.any() and data.progress.size:
            base = np.nanmean(data.progress[:, before], axis=1)
        else:
            base = np.full(len(data.progress), np.nan)
        base[base <= 0] = np.nan
        return np.asarray(data.progress / base[:, None])


def progress_heatmap(data: IncidentData, path: Path) -> None:
    """Rank x time heatmap of progress relative to each rank's own before."""
    rel = relative_progress(data)
    n = max(len(data.ranks), 1)
    fig, ax = plt.subplots(figsize=(11, min(3 + n * 0.06, 9)), layout="constrained")
    cmap = plt.get_cmap("viridis").with_extremes(bad="#bbbbbb")
    x0, x1 = _span(data)
    img = ax.imshow(
        np.clip(rel, 0, 1.5), aspect="auto", interpolation="nearest", cmap=cmap,
        vmin=0, vmax=1.5, origin="lower", extent=(x0, x1, -0.5, n - 0.5),
    )  # fmt: skip
    fig.colorbar(img, ax=ax, label="chunks / rank's mean before")
    if not len(data.ranks):
        ax.text(0.5, 0.5, "no state records of the job in the window",
                ha="center", transform=ax.transAxes)  # fmt: skip
    _marks(ax, data)
    index = {int(r): i for i, r in enumerate(data.ranks.tolist())}
    culprits = [index[r] for r in culprit_ranks(data) if r in index]
    if culprits:
        ax.scatter(
            [x0] * len(culprits), culprits, marker=">", s=80, color=CULPRIT,
            clip_on=False, zorder=5, label="culprit",
        )  # fmt: skip
        for i in culprits:
            ax.axhline(i, color=CULPRIT, lw=0.6, alpha=0.7)
    step = max(1, 2 ** math.ceil(math.log2(max(n / 16, 1))))
    ticks = list(range(0, n, step))
    ax.set_yticks(ticks, [str(int(data.ranks[i])) for i in ticks] if n > 1 else [])
    ax.set_xlabel(f"seconds from onset ({BIN_NS / 1e6:.0f} ms bins)")
    ax.set_ylabel("rank")
    ax.set_title("progress per rank: grey = no report, dark = stopped")
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    _save(fig, path)


def culprit_flows(data: IncidentData, path: Path) -> bool:
    """Cumulative G/T/D chunks of the culprit's flows both ways, and gaps;
    one column per direction that moved chunks in the window. Returns whether
    there was any to draw (no file is written otherwise)."""
    f = data.flow
    shown = [k for k in range(len(f.labels)) if f.gtd[f.key == k].any()]
    if not shown:
        return False
    fig, axes = plt.subplots(
        2, len(shown), figsize=(6 * len(shown), 5.5), sharex=True,
        layout="constrained", height_ratios=(2, 1), squeeze=False,
    )  # fmt: skip
    x0, x1 = _span(data)
    for col, k in enumerate(shown):
        top, low = axes[0, col], axes[1, col]
        mine = f.key == k
        t, gtd = _rel(data, f.t_ns[mine]), f.gtd[mine]
        label = f.labels[k]
        top.set_title(f"culprit's flow {label}" if label else "", fontsize=10)
        for i, (name, colour) in enumerate(GTD):
            top.step(t, gtd[:, i], where="post", label=name, color=colour, lw=1.4)
        low.step(t, gtd[:, 0] - gtd[:, 1], where="post", label="G - T", color=GTD[0][1])
        low.step(t, gtd[:, 1] - gtd[:, 2], where="post", label="T - D", color=GTD[1][1])
        top.set_ylabel("chunks (cumulative)")
        low.set_ylabel("backlog (chunks)")
        low.set_xlabel("seconds from onset")
        for ax in (top, low):
            _marks(ax, data)
            ax.set_xlim(x0, x1)
            ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
            ax.legend(loc="upper left", fontsize=7)
            ax.grid(alpha=0.3)
        low.set_ylim(top=max(1.0, low.get_ylim()[1]))  # a flat zero, not +-0.04
    _save(fig, path)
    return True


def wait_graph(data: IncidentData, edges: list[Edge], path: Path) -> None:
    """The wait-for chain: ranks on a circle in chain order, culprit red."""
    culprits = set(culprit_ranks(data))
    nodes = list(dict.fromkeys([n for e in edges for n in (e.src, e.dst)]))
    nodes += [r for r in sorted(culprits) if r not in nodes]
    fig, ax = plt.subplots(figsize=(6.5, 6.5), layout="constrained")
    ax.set_axis_off()
    ax.set_aspect("equal")
    if not nodes:
        ax.text(0.5, 0.5, "no wait-for edges and no culprit", ha="center")
        _save(fig, path)
        return
    angle = np.pi / 2 - 2 * np.pi * np.arange(len(nodes)) / len(nodes)
    pos = {n: (math.cos(a), math.sin(a)) for n, a in zip(nodes, angle, strict=True)}
    if len(nodes) == 1:
        pos = {nodes[0]: (0.0, 0.0)}
    for e in edges:
        (x0, y0), (x1, y1) = pos[e.src], pos[e.dst]
        ax.annotate(
            "", xy=(x1, y1), xytext=(x0, y0),
            arrowprops={"arrowstyle": "-|>", "color": EDGE_COLOURS.get(e.kind, "grey"),
                        "lw": 1.6, "shrinkA": 17, "shrinkB": 17,
                        "connectionstyle": "arc3,rad=0.12"},
        )  # fmt: skip
    for n, (x, y) in pos.items():
        bad = n in culprits
        ax.scatter([x], [y], s=1100, color=CULPRIT if bad else "#e8e8e8",
                   edgecolors="black", zorder=3)  # fmt: skip
        ax.text(x, y, str(n), ha="center", va="center", zorder=4, fontsize=10,
                color="white" if bad else "black", weight="bold")  # fmt: skip
    kinds = sorted({e.kind for e in edges})
    for kind in kinds:
        what = "culprit flow" if kind == "flow" else f"{kind} wait"
        ax.plot([], [], color=EDGE_COLOURS.get(kind, "grey"), label=what)
    ax.scatter([], [], color=CULPRIT, label="culprit")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, -0.06), ncol=3, fontsize=9)
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-1.35, 1.35)
    waits = any(k != "flow" for k in kinds)
    ax.set_title(
        "wait-for chain (arrow: waits on)"
        if waits
        else "no wait-for chain (every rank progresses): the culprits' flows"
    )
    _save(fig, path)


def baselines(data: IncidentData, path: Path) -> None:
    """Each fired baseline's metric over time, the baseline, the fired ops."""
    panels = data.panels
    fig, axes = plt.subplots(
        max(len(panels), 1), 1, figsize=(11, 1.2 + 2.4 * max(len(panels), 1)),
        layout="constrained", squeeze=False, sharex=True,
    )  # fmt: skip
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no latency baseline fired", ha="center")
        axes[0, 0].set_axis_off()
    for ax, p in zip(axes[:, 0], panels, strict=False):
        f, t = p.fired, _rel(data, p.t_ns)
        ms = p.value_s * 1e3
        ax.plot(t, ms, ".", color="#555555", ms=4, label=f.metric)
        ax.plot(t[p.hit], ms[p.hit], "o", color=CULPRIT, ms=7, label="fired")
        what = "limit" if f.metric == "stall" else "baseline (median)"
        ax.axhline(f.baseline * 1e3, color="#2ca02c", ls="--", lw=1.2, label=what)
        _marks(ax, data)
        ax.set_ylabel("ms")
        ax.set_title(
            f"{f.detector}: {f.label}: {f.value * 1e3:.1f} ms vs {what} "
            f"{f.baseline * 1e3:.1f} ms ({f.count} fired)", fontsize=9,
        )  # fmt: skip
        ax.set_xlim(*_span(data))
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds from onset")
    _save(fig, path)
