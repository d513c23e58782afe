"""Write ``bench/RESULTS.md`` from the JSON files in ``bench/results/``.

Every number in RESULTS.md comes from a results file written by a benchmark
script; nothing is typed in by hand. Run ``./dev bench`` to regenerate all.

Each section says the commit and date it was measured at, and is marked
stale when a later commit touched the code it measures (``MEASURES``).
``python bench/report.py --check`` (``./dev bench --check``) lists the stale
sections and exits 1 when there are any.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from render_bad_input import RENDERERS as BAD_INPUT_RENDERERS
from render_ctrl_c import RENDERERS as CTRL_C_RENDERERS
from render_general import RENDERERS as GENERAL_RENDERERS
from render_indep import RENDERERS as INDEP_RENDERERS
from render_perf import RENDERERS as PERF_RENDERERS
from render_perf import Renderer, fault_table
from render_reliability import RENDERERS as RELIABILITY_RENDERERS
from render_torch import RENDERERS as TORCH_RENDERERS
from render_two_stage import RENDERERS as TWO_STAGE_RENDERERS

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def _row(label: str, stat: dict[str, Any]) -> str:
    return f"| {label} | {stat['median']} | {stat['max']} |"


def _broker(r: dict[str, Any]) -> list[str]:
    return [
        f"Kafka {r['kafka_version']} single-node KRaft broker, "
        f"heap {r['heap_mb']} MiB, {r['runs']} fresh starts (storage format "
        f"included), {r['machine']['cpus']} CPUs.",
        "",
        "| metric | median | max |",
        "|---|---|---|",
        _row("start to serving metadata (s)", r["start_s"]),
        f"| stop (s) | {r['stop_s']['median']} | {r['stop_s']['max']} |",
        f"| RSS after start (MB) | {r['rss_mb_after_start']['median']} "
        f"| {r['rss_mb_after_start']['max']} |",
        f"| RSS after {r['load']['messages']} x {r['load']['bytes_each']} B (MB) "
        f"| {r['rss_mb_after_load']['median']} | {r['rss_mb_after_load']['max']} |",
    ]


_GOALS = {
    "hang detection p90": "<= 3 s",
    "slowdown detection p90": "<= 10 s",
    "root cause p90 after detection": "<= 5 s",
    "culprit rank (top-1)": ">= 95 %",
    "component": ">= 90 %",
    "exact flow (link faults)": ">= 85 %",
    "false root causes, healthy runs": "0",
}
_PAPER = (
    "Paper (Mycroft, SOSP'25, production): 90 % of hangs detected within 15 s; "
    "about 60 % of root causes within 20 s, all within 60 s; 7 injected fault "
    "types on 32 GPUs all detected and localized (no per-type accuracy given)."
)


def _campaign(r: dict[str, Any]) -> list[str]:
    lines = [
        "Every fault type x seeds, simulated and analyzed in-process (the "
        "`mycroft analyze` code path); fault rank, onset and severity drawn by "
        "the simulator from the seed. Scoring rules: `bench/campaign/score.py` "
        "(a culprit counts when it is the faulty rank or one of the ranks "
        "equally attached to the faulty part: the 2 GPUs of a NIC, the GPUs of "
        "a host or of the hosts under a switch; the flow of a link fault whose "
        "truth has no peer counts when it leaves one of those ranks toward "
        "another host). Latencies in seconds; CDFs in "
        "`bench/results/campaign_offline_cdf.png`.",
        "",
        "Goals: " + "; ".join(f"{k} {v}" for k, v in _GOALS.items()) + ". " + _PAPER,
        "",
    ]
    for size, part in sorted(r["sizes"].items(), key=lambda kv: int(kv[0])):
        sh = part["shape"]
        lines += [
            f"### {size} ranks (tp {sh['tp']}, pp {sh['pp']}, dp {sh['dp']}), "
            f"{part['seeds_per_fault']} seed(s) per fault, "
            f"{part['duration_s']:g} s per run",
            "",
            *fault_table(part["per_fault"]),
        ]
        lines += ["", *_healthy_line(part)]
        t = part.get("timing", {})
        lines += [
            "Analyzer `evaluate()` per 100 ms round (since 085d52a it also "
            "joins the completions queued since the last round): p50 "
            f"{t.get('evaluate_ms_p50')} "
            f"ms, max {t.get('evaluate_ms_max')} ms; one run (simulate + analyze) "
            f"p50 {t.get('run_wall_s_p50')} s wall; part took {part['wall_s']} s "
            f"on {part.get('workers', r.get('machine', {}).get('workers'))} worker(s).",
            "",
        ]
        if part.get("command"):
            lines += [f"This part: `{part['command']}` at {part.get('commit')}.", ""]
        if part.get("done"):
            lines += [f"**Partial:** {part['done']} were finished.", ""]
    return lines


def _healthy_line(part: dict[str, Any]) -> list[str]:
    h = part["per_fault"].get("healthy")
    if not h:
        return []
    return [
        f"Healthy: {h['n']} runs, {h['simulated_minutes']} simulated minutes, "
        f"{h['false_root_causes']} false root cause(s), {h['false_anomalies']} "
        "false anomalies.",
        "",
    ]


def _shapes(r: dict[str, Any]) -> list[str]:
    lines = [
        "The offline campaign on job shapes the main campaign does not use "
        "(`TPxPPxDP`, 8 GPUs per host, 2 per NIC): TP groups smaller than a "
        "host (a host holds several members of one data-parallel group), no "
        "pipeline, 128 ranks. Scored as the offline campaign above; "
        f"{r['seeds_per_fault']} seed(s) per fault and shape, "
        f"{r['duration_s']:g} s per run; measured at {r['commit']}, "
        f"{r['wall_s']} s on {r['cpus']} CPUs.",
        "",
    ]
    for shape, per_fault in r["per_shape"].items():
        runs = [a for f, a in per_fault.items() if f != "healthy"]
        n = sum(a["n"] for a in runs)
        right = sum(a["rank_accuracy"] * a["n"] for a in runs)
        comp = sum(a["component_accuracy"] * a["n"] for a in runs)
        lines += [
            f"### {shape}: rank right in {right:.0f} of {n} fault runs, "
            f"component in {comp:.0f}",
            "",
            *fault_table(per_fault),
            "",
            *_healthy_line({"per_fault": per_fault}),
        ]
    return lines


def _nccl_plugin(r: dict[str, Any]) -> list[str]:
    abis = r["abis"]
    names = list(abis["v6"]["callbacks"])
    rep = r["reported_example_plugin"]
    lines = [
        f"{r['setup']}; {r['machine']['cpu']} ({r['machine']['cpus']} CPUs), "
        f"at {r['commit']}. Median ns per call (p99 in brackets), the timer's "
        "own cost removed; `empty call` is a call through the table to a function "
        "that does nothing.",
        "",
        "| callback | " + " | ".join(abis) + " |",
        "|---|" + "---|" * len(abis),
    ]
    for n in names:
        cells = [
            f"{v['callbacks'][n]['median_ns']} ({v['callbacks'][n]['p99_ns']})"
            for v in abis.values()
        ]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    v6 = abis["v6"]
    share = ", ".join(f"{k} {v} %" for k, v in v6["step_share_of_transfer_pct"].items())
    intra = ", ".join(f"{k} ch {v} ns" for k, v in v6["intra_node_op_ns"].items())
    lines += [
        "",
        f"v6 per network step (start, states, stop): send {v6['send_step_ns']} ns, "
        f"recv {v6['recv_step_ns']} ns, on NCCL's proxy thread. Against the wire "
        f"time of one step: {share}. Per op: Coll {v6['coll_ns']} ns (enqueue "
        f"thread), ProxyOp {v6['proxy_op_ns']} ns per flow; an intra-node op "
        f"(KernelCh only, {v6['kernel_ch_ns']} ns per channel): {intra}. The "
        f"tick thread's work (ring writes) is {v6['tick_us_per_64_ops']} us per "
        "64 ops, off the event path.",
        "",
        f"Reported for NCCL's example plugin ({rep['source']}): "
        f"{rep['nccl_2.29.7_pct'][0]}-{rep['nccl_2.29.7_pct'][1]} % on 2.29.7, "
        f"{rep['nccl_2.31.2_pct'][0]}-{rep['nccl_2.31.2_pct'][1]} % on 2.31.2, of "
        "job time; Mycroft's plugin has not yet been measured on a GPU "
        "(`producers/nccl/gpu_check.sh`).",
    ]
    if "rates" in r:
        lines += ["", f"**Op rates.** {r['rates']['setup']}:", ""]
        lines += [
            "| ops/s | kind | ops issued | OP_DONE | dropped ops | dropped flows "
            "| records/s into the ring |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for x in r["rates"]["runs"]:
            kind = (
                f"all-to-all, {x['p2p_peers']} peers" if x["p2p_peers"] else "AllReduce"
            )
            lines.append(
                f"| {x['rate_ops_per_s']:,} | {kind} | {x['ops_issued']:,} "
                f"| {x['op_done']:,} | {x['dropped_ops']:,} | {x['dropped_flows']:,} "
                f"| {x['records_per_s']:,} |"
            )
    return lines


RENDERERS = {
    "nccl_plugin_overhead": (
        "NCCL profiler plugin: cost per callback and op rates",
        "python bench/nccl_plugin_overhead.py",
        _nccl_plugin,
    ),
    "campaign_shapes": (
        "Offline fault campaign on other job shapes",
        "python bench/campaign_shapes.py --seeds 3",
        _shapes,
    ),
    "campaign_offline": (
        "Offline fault campaign (detection and root-cause accuracy)",
        "python bench/campaign_offline.py --size 64 --seeds 10 --duration 24 "
        "--healthy-runs 3 --healthy-duration 60",
        _campaign,
    ),
    "broker_startup": (
        "Kafka broker start-up and memory",
        "python bench/broker_startup.py --out bench/results/broker_startup.json",
        _broker,
    ),
}


def _analyze_cost(r: dict[str, Any]) -> list[str]:
    sizes = sorted(r["sizes"].items(), key=lambda kv: int(kv[0]))
    stages = sorted(
        {k for _, x in sizes for k in x.get("profiled_cpu_s_by_stage", {})},
        key=lambda k: -max(x["profiled_cpu_s_by_stage"].get(k, 0) for _, x in sizes),
    )
    lines = [
        "`mycroft analyze TRACE --json` on a healthy simulated job (seed "
        f"{r['seed']}), timed by `/usr/bin/time` without a profiler (CPU = user + "
        "sys). Then the same code path under pyinstrument: CPU s by stage, "
        "each sample charged to the innermost module of a known stage (the "
        "summaries in `bench/profiles/`).",
        "",
        "| ranks | shape | trace s | CPU s / trace s | ranks per core | wall (s) "
        "| peak RSS (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, x in sizes:
        lines.append(
            f"| {size} | tp {x['tp']} pp {x['pp']} dp {x['dp']} | {x['trace_s']:g} "
            f"| {x['cpu_s_per_trace_s']} | {x['ranks_per_core']} | {x['wall_s']} "
            f"| {x['peak_rss_mb']} |"
        )
    if stages:
        head = " | ".join(f"{size} ranks (CPU s)" for size, _ in sizes)
        lines += ["", f"| stage (profiled) | {head} |", "|---|" + "---|" * len(sizes)]
        for k in stages:
            cells = " | ".join(
                str(x.get("profiled_cpu_s_by_stage", {}).get(k, 0)) for _, x in sizes
            )
            lines.append(f"| {k} | {cells} |")
    return lines


RENDERERS["analyze_cost"] = (
    "Offline analyzer cost and profile, 1,024 and 2,048 ranks",
    "python bench/profile_analyze.py",
    _analyze_cost,
)

RENDERERS.update(PERF_RENDERERS)
RENDERERS.update(INDEP_RENDERERS)
RENDERERS.update(TORCH_RENDERERS)
_SIM_SPEED = RENDERERS["sim_speed"]


def _sim_speed(r: dict[str, Any]) -> list[str]:
    lines = _SIM_SPEED[2](r)
    was, now = r.get("sim_before"), r["sim"]
    if was:
        lines += [
            "",
            f"CPU of the {now['ranks']}-rank, {now['virtual_s']:g} s run (one "
            f"core, default config): {was['cpu_s']} s at {was['commit']}, "
            f"{now['cpu_s']} s at {r.get('commit')} (same machine, same trace "
            "byte for byte the same); goal <= 20 CPU s.",
        ]
    return lines


RENDERERS["sim_speed"] = (_SIM_SPEED[0], _SIM_SPEED[1], _sim_speed)
RENDERERS.update(TWO_STAGE_RENDERERS)
RENDERERS.update(RELIABILITY_RENDERERS)
RENDERERS.update(BAD_INPUT_RENDERERS)
RENDERERS.update(GENERAL_RENDERERS)
RENDERERS.update(CTRL_C_RENDERERS)


def _generic(r: dict[str, Any]) -> list[str]:
    return ["```json", json.dumps(r, indent=2), "```"]


ROOT = BENCH.parent
_CORE = ("streams/core", "schemas")
_SIM = ("producers/sim",)
_WORKER = ("streams", "schemas")
# Results file (its name, or a prefix ending in "_") -> the source paths
# whose code its numbers measure. A section is stale when one of these paths
# changed in a commit that its measurement's commit does not contain.
MEASURES: dict[str, tuple[str, ...]] = {
    "agent_footprint": ("producers/agent", "producers/ring.py", "schemas"),
    "analyze_cost": (*_CORE, "streams/analyze.py", "producers/tracefile.py"),
    "bad_input": _CORE,
    "broker_startup": ("infra/kafka", "infra/kafka_broker.py"),
    "campaign_": (*_CORE, *_SIM, "bench/campaign"),
    "campaign_live_": (*_WORKER, *_SIM, "producers/replay.py", "bench/campaign"),
    "ctrl_c": ("mycroft", "streams", "producers"),
    "gate_cost": _CORE,
    "ingest_cost": _CORE,
    "message_size": ("schemas", "producers/agent"),
    "nccl_plugin_overhead": ("producers/nccl",),
    "rca_cost": _CORE,
    "sim_speed": _SIM,
    "snapshot_cost": (*_CORE, "streams/faust_runtime.py"),
    "streams_throughput": _WORKER,
    "torch_": ("producers/torch", "streams/flight_recorder.py"),
    "two_stage": _WORKER,
    "verdict_equality": (*_WORKER, "mycroft/verdict.py", "producers/replay.py"),
    "worker_saturation": _WORKER,
}
_HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def measures(name: str) -> tuple[str, ...]:
    """Source paths the results file ``name`` measures (longest key wins)."""
    keys = [
        k
        for k in MEASURES
        if name == k or name.startswith(k if k.endswith("_") else k + "_")
    ]
    return MEASURES[max(keys, key=len)] if keys else ()


class Git:
    """The few git questions the check asks, answered in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[str, ...], str | None] = {}

    def out(self, *args: str) -> str | None:
        """Stdout of ``git ARGS`` (stripped), or None when it fails."""
        if args not in self._cache:
            p = subprocess.run(
                ["git", *args],
                cwd=self.root,
                capture_output=True,
                text=True,
                check=False,
            )
            self._cache[args] = p.stdout.strip() if p.returncode == 0 else None
        return self._cache[args]

    def commit(self, ref: str) -> str | None:
        """Full hash of ``ref`` when it names a commit of this repository."""
        return self.out("rev-parse", "--verify", "--quiet", ref + "^{commit}") or None

    def last(self, paths: tuple[str, ...], fmt: str = "%H") -> str | None:
        """``fmt`` of the last commit that touched code (not docs) in ``paths``."""
        code = (*paths, ":(exclude,glob)**/*.md")
        return self.out("log", "-1", f"--format={fmt}", "--", *code) or None

    def contains(self, commit: str, ancestor: str) -> bool:
        """Whether ``commit``'s history includes ``ancestor``."""
        p = subprocess.run(
            ["git", "merge-base", "--is-ancestor", ancestor, commit],
            cwd=self.root,
            capture_output=True,
            check=False,
        )
        return p.returncode == 0

    def modified(self, path: str) -> bool:
        """Whether ``path`` is untracked or differs from HEAD."""
        return bool(self.out("status", "--porcelain", "--", path))


@dataclass
class Stamp:
    """When one section was measured, and whether its code moved on since."""

    label: str  # the measurement's commit, as the results file gives it
    date: str
    stale_since: str | None = None  # last commit touching its sources, if newer
    stale_date: str = ""
    sources: tuple[str, ...] = ()


def stamp(name: str, data: Any, path: Path, git: Git) -> Stamp:
    """Stamp results file ``path`` (named ``name``, holding ``data``)."""
    rel = str(path.relative_to(git.root))
    doc = data if isinstance(data, dict) else {}
    label = str(doc.get("commit") or "")
    fresh_file = git.modified(rel)
    tokens = list(dict.fromkeys(_HEX.findall(label)))
    if len(tokens) > 1 and not _HEX.sub("", label).strip(", "):
        label = ", ".join(tokens)  # a list of commits: each once
    commits = [c for tok in tokens if (c := git.commit(tok))]
    if not commits and not fresh_file:
        # no usable commit field: the commit that added this version of the file
        if (c := git.last((rel,))) is not None:
            commits, label = [c], label or f"{c[:10]} (committed with)"
    date = str(doc.get("date") or "")
    if not date and (m := _DATE.search(label)):
        date = m.group(0)
    if not date and not fresh_file:
        date = git.last((rel,), "%cs") or ""
    if not date:
        mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        date = mtime.strftime("%Y-%m-%d")
    st = Stamp(label=label or "the working tree", date=date, sources=measures(name))
    last = git.last(st.sources) if st.sources else None
    if last is not None and any(not git.contains(c, last) for c in commits):
        st.stale_since = last
        st.stale_date = git.last(st.sources, "%cs") or ""
    return st


def stamp_lines(st: Stamp) -> list[str]:
    """The section's 'measured at' line, and its stale note if any."""
    lines = [f"Measured at {st.label}, {st.date}.", ""]
    if st.stale_since:
        lines += [
            f"> **Stale:** {', '.join(st.sources)} changed after this measurement "
            f"(last in {st.stale_since[:10]}, {st.stale_date}); rerun the command.",
            "",
        ]
    return lines


def stamps(results: Path = RESULTS, root: Path = ROOT) -> dict[str, Stamp]:
    """Every results file's stamp, by name."""
    git = Git(root)
    return {
        p.stem: stamp(p.stem, json.loads(p.read_text()), p, git)
        for p in sorted(results.glob("*.json"))
    }


def _section(name: str, data: Any) -> Renderer:
    """Title, command and renderer of results file ``name``."""
    if name in RENDERERS:
        return RENDERERS[name]
    if name.startswith("campaign_general_") and "halves" in data:
        # a general campaign run on chosen settings: its command and note say which
        half = GENERAL_RENDERERS["campaign_general_report"][2]
        what = name.removeprefix("campaign_general_").replace("_", " ")
        return (
            f"General campaign: {what}",
            data.get("command", "python bench/campaign_general.py"),
            lambda r: [r.get("note", ""), "", *half(r)],
        )
    return (name, f"python bench/{name}.py", _generic)


def render() -> str:
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python bench/report.py` from `bench/results/*.json`. "
        "`./dev bench` reruns the quick benchmarks and this page; each section "
        "gives the command that regenerates it (the campaigns take hours), the "
        "commit and date it was measured at, and a note where the code it "
        "measures changed since (`./dev bench --check` lists those).",
        "",
    ]
    marks = stamps()
    for path in sorted(RESULTS.glob("*.json")):
        name = path.stem
        data = json.loads(path.read_text())
        title, command, fn = _section(name, data)
        lines += [f"## {title}", "", f"Command: `{command}`", ""]
        lines += stamp_lines(marks[name])
        lines += fn(data)
        lines += [""]
    history = BENCH / "history.md"  # hand-written, dated: kept as it is
    if history.exists():
        lines += [history.read_text().rstrip(), ""]
    return "\n".join(lines)


def check() -> int:
    """Print the stale sections; 1 when there are any."""
    stale = {n: s for n, s in stamps().items() if s.stale_since}
    for name, st in stale.items():
        since = f"{(st.stale_since or '')[:10]} ({st.stale_date})"
        print(
            f"stale: {name} measured at {st.label} ({st.date}); "
            f"{', '.join(st.sources)} changed in {since}"
        )
    print(f"{len(stale)} stale section(s)" if stale else "no stale sections")
    return 1 if stale else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        raise SystemExit(check())
    (BENCH / "RESULTS.md").write_text(render())
