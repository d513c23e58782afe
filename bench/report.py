"""Write ``bench/RESULTS.md`` from the JSON files in ``bench/results/``.

Every number in RESULTS.md comes from a results file written by a benchmark
script; nothing is typed in by hand. Run ``./dev bench`` to regenerate all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from render_bad_input import RENDERERS as BAD_INPUT_RENDERERS
from render_ctrl_c import RENDERERS as CTRL_C_RENDERERS
from render_general import RENDERERS as GENERAL_RENDERERS
from render_perf import RENDERERS as PERF_RENDERERS
from render_perf import fault_table
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


RENDERERS.update(PERF_RENDERERS)
RENDERERS.update(TORCH_RENDERERS)
RENDERERS.update(TWO_STAGE_RENDERERS)
RENDERERS.update(RELIABILITY_RENDERERS)
RENDERERS.update(BAD_INPUT_RENDERERS)
RENDERERS.update(GENERAL_RENDERERS)
RENDERERS.update(CTRL_C_RENDERERS)


def _generic(r: dict[str, Any]) -> list[str]:
    return ["```json", json.dumps(r, indent=2), "```"]


def render() -> str:
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python bench/report.py` from `bench/results/*.json`. "
        "`./dev bench` reruns the quick benchmarks and this page; each section "
        "gives the command that regenerates it (the campaigns take hours).",
        "",
    ]
    for path in sorted(RESULTS.glob("*.json")):
        name = path.stem
        title, command, fn = RENDERERS.get(
            name, (name, f"python bench/{name}.py", _generic)
        )
        lines += [f"## {title}", "", f"Command: `{command}`", ""]
        lines += fn(json.loads(path.read_text()))
        lines += [""]
    history = BENCH / "history.md"  # hand-written, dated: kept as it is
    if history.exists():
        lines += [history.read_text().rstrip(), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    (BENCH / "RESULTS.md").write_text(render())
