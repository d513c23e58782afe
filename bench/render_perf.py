"""RESULTS.md sections of the performance benchmarks (used by report.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Renderer = tuple[str, str, Callable[[dict[str, Any]], list[str]]]


def _message_size(r: dict[str, Any]) -> list[str]:
    job, msg = r["job"], r["per_message"]
    rows = [
        f"Simulated healthy job: {job['ranks']} ranks (tp {job['tp']} x pp "
        f"{job['pp']} x dp {job['dp']}), {job['hosts']} hosts of 8 GPUs, "
        f"{job['duration_s']:.0f} s, {job['iterations']} iterations, "
        f"{job['interval_ms']} ms ticks.",
        "",
        "| record (one host, one tick) | wire bytes median / p90 / max | lz4 bytes "
        "median / p90 / max | rows (rc, op, flow) median |",
        "|---|---|---|---|",
    ]
    for name, s in msg.items():
        counts = ", ".join(
            str(int(s[g]["median"])) for g in ("rc", "op", "flow") if g in s
        )
        rows.append(
            f"| {name} | {s['wire']['median']:.0f} / {s['wire']['p90']:.0f} / "
            f"{s['wire']['max']:.0f} | {s['lz4']['median']:.0f} / {s['lz4']['p90']:.0f}"
            f" / {s['lz4']['max']:.0f} | {counts} |"
        )
    rows += [
        "",
        f"Bytes per training iteration per host: {r['bytes_per_iteration_per_host']:,}"
        f" on the wire, {r['bytes_per_iteration_per_host_lz4']:,} after lz4 "
        f"(paper: {r['paper_bytes_per_iteration_per_machine']:,} per machine).",
    ]
    return rows


def _sim_speed(r: dict[str, Any]) -> list[str]:
    sim, load = r["sim"], r["load"]
    return [
        "| run | wall (s) | goal | peak RSS (MB) | notes |",
        "|---|---|---|---|---|",
        f"| {sim['ranks']} ranks (tp {sim['tp']} pp {sim['pp']} dp {sim['dp']}) x "
        f"{sim['virtual_s']:.0f} s virtual, one core | {sim['wall_s']} | <= "
        f"{sim['goal_wall_s']:.0f} s | {sim['peak_rss_mb']} | {sim['iterations']} "
        f"iterations, {sim['records']:,} records, {sim['trace_bytes'] / 1e9:.2f} GB |",
        f"| load generator, {load['ranks']:,} ranks ({load['hosts']:,} hosts) x "
        f"{load['ticks']} ticks | {load['wall_s']} | RSS <= {load['goal_rss_mb']} MB | "
        f"{load['peak_rss_mb']} | {load['records_per_s']:,} encoded records/s, "
        f"{load['virtual_x_realtime']}x real time on one core |",
    ]


def _rca_cost(r: dict[str, Any]) -> list[str]:
    return [
        f"One refresh of the slowdown root cause over the {r['window_s']:g} s since "
        f"the onset (every flow snapshot and collective of the window), median of "
        f"{r['repeat']}, in process on {r['cpus']} CPUs; the incident refreshes "
        f"every 1 s of trace while its answer changes or anomalies join it, then "
        f"half as often each time the answer holds, down to every 4 s. "
        f"Source {r['commit']}.",
        "",
        "| ranks | fault | collectives | flow snapshot rows | refresh (s) | max (s) "
        "| without compute gaps (s) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {x['ranks']} | {x['fault']} | {x['collectives']:,} | "
            f"{x['flow_snapshot_rows']:,} | {x['refresh_s']} | {x['refresh_max_s']} "
            f"| {x.get('refresh_without_gaps_s', '-')} |"
            for x in r["rows"]
            if "collectives" in x
        ),
        "",
        "One refresh of a hang's root cause over the latest state (the wait-for "
        "graph over every busy rank and its flow rows, the terminal groups, the "
        "hang rules), at the end of the same window; a hang refreshes every 1 s "
        "of trace.",
        "",
        "| ranks | fault | busy (rank, comm) | latest flow rows | refresh (s) "
        "| max (s) |",
        "|---|---|---|---|---|---|",
        *(
            f"| {x['ranks']} | {x['fault']} | {x['busy_rank_comms']:,} | "
            f"{x['latest_flow_rows']:,} | {x['refresh_s']} | {x['refresh_max_s']} |"
            for x in r["rows"]
            if "busy_rank_comms" in x
        ),
    ]


def _snapshot_cost(r: dict[str, Any]) -> list[str]:
    return [
        "One job's engine snapshot as a worker writes it (parts + zlib) and "
        "restores it, after a simulated job of "
        f"{r['trace_s']:g} trace s fed to one analyzer in process; CPU s, median "
        f"(least) of {r['repeat']} on {r['cpus']} CPUs. Snapshots may take "
        f"{r['budget']:.0%} of a worker's time, which spaces a big job's "
        f"snapshots. Source {r['commit']}.",
        "",
        "| ranks | job | collectives kept | snapshot (MB) | dump (s) | restore (s) "
        "| snapshot every (s) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {x['ranks']} | {x['job']} | {x['collectives_kept']:,} | "
            f"{x['snapshot_mb']} | {x['dump_s']} ({x['dump_min_s']}) | "
            f"{x['restore_s']} ({x['restore_min_s']}) | {x['snapshot_every_s']} |"
            for x in r["rows"]
        ),
    ]


def _ingest_cost(r: dict[str, Any]) -> list[str]:
    return [
        "One analyzer fed a healthy simulated job in process (every record "
        f"ingested, evaluate every {r['cadence_ms']} ms of trace), least CPU of "
        f"{r['repeat']} on {r['cpus']} CPUs. Above 1 CPU s per trace s, one core "
        f"cannot follow the job in real time. Completion batches are only "
        "queued on arrival; evaluate joins them into collectives and observes "
        f"those. Source {r['commit']}.",
        "",
        "| ranks | rank-state rows / trace s | completion rows / trace s | "
        "CPU s / trace s | state / completion / evaluate | rank-state rows / CPU s |",
        "|---|---|---|---|---|---|",
        *(
            f"| {x['ranks']} | {x['rc_rows_per_trace_s']:,} | "
            f"{x['completion_rows_per_trace_s']:,} | {x['cpu_s_per_trace_s']} | "
            + " / ".join(
                str(x["cpu_s_per_trace_s_by_phase"].get(k, 0))
                for k in ("state", "completion", "evaluate")
            )
            + f" | {x['rc_rows_per_cpu_s']:,} |"
            for x in r["rows"]
        ),
    ]


def _gate_cost(r: dict[str, Any]) -> list[str]:
    return [
        "`Analyzer.ingest` of a healthy simulated job, three gate modes "
        f"interleaved in one run, least CPU of {r['repeat']} on {r['cpus']} CPUs: "
        "no checks, the per-row checks only, and the shipped gate (whole-batch "
        f"checks first, per-row ones on a failure). Source {r['commit']}.",
        "",
        "| ranks | records | ingest CPU s / trace s (none / per-row / fast) | "
        "gate us / record (per-row / fast) | fast / per-row |",
        "|---|---|---|---|---|",
        *(
            f"| {x['ranks']} | {x['records']:,} | "
            + " / ".join(
                str(x["ingest_cpu_s_per_trace_s"][m])
                for m in ("none", "per-row", "fast")
            )
            + " | "
            + " / ".join(
                str(x["gate_cpu_us_per_record"][m]) for m in ("per-row", "fast")
            )
            + f" | {x['gate_cost_fast_over_per_row']} |"
            for x in r["rows"]
        ),
    ]


def _agent(r: dict[str, Any]) -> list[str]:
    s, g = r["setup"], r["goals"]
    return [
        f"One node: {s['gpus']} GPUs, {s['sampling_ms']} ms sampling, an op every "
        f"{s['op_ms']} ms with {s['flows_per_op']} flows per rank, "
        f"{s['seconds']:.0f} s, real broker, {s['cpus']} CPUs shared with the "
        "writers and the broker.",
        "",
        "| metric | measured | goal |",
        "|---|---|---|",
        f"| agent CPU (% of one core) | {r['agent_cpu_percent_of_one_core']:.2f} | <= "
        f"{g['cpu_percent']} |",
        f"| agent RSS (MB) | {r['agent_rss_mb']:.1f} | <= {g['rss_mb']} |",
        f"| ring writer, flow-progress fast path (ns/record, Python) | "
        f"{r['ring_writer']['flow_progress_fast_path_ns']:.0f} | - |",
        f"| ring writer, generic record (ns/record, Python) | "
        f"{r['ring_writer']['generic_write_ns']:.0f} | - |",
        "| Kafka bytes per iteration per host | "
        f"{r['bytes_per_iteration_per_host']:,.0f} | paper: "
        f"{r['paper_bytes_per_iteration_per_host']:,} |",
    ]


def _streams(r: dict[str, Any]) -> list[str]:
    rows = [
        "One record = one rank x communicator x tick (an `rc` row). Workers share "
        f"{r['cpus']} CPUs with the broker and the load producer.",
        "",
        "| setup | offered records/s | processed records/s | worst consumer lag (s) |",
        "|---|---|---|---|",
    ]
    for key in ("one_worker", "two_workers"):
        run = r[key]
        lag = max(w["max_lag_s"] for w in run["per_worker"])
        rows.append(
            f"| {run['workers']} worker(s), {run['jobs']} jobs | "
            f"{run['offered_rows_per_s']:,} | {run['total_rows_per_s']:,} | {lag:.2f} |"
        )
    rows += ["", f"Scaling ratio, 2 workers / 1 worker: {r['scaling_ratio']}."]
    return rows


RENDERERS: dict[str, Renderer] = {
    "message_size": (
        "Batched message size of an 8-GPU host",
        "python bench/message_size.py",
        _message_size,
    ),
    "sim_speed": ("Simulator speed", "python bench/sim_speed.py", _sim_speed),
    "rca_cost": (
        "Root cause: cost of one refresh as the job grows",
        "python bench/rca_cost.py",
        _rca_cost,
    ),
    "ingest_cost": (
        "Analyzer cost per second of a healthy job",
        "python bench/ingest_cost.py",
        _ingest_cost,
    ),
    "gate_cost": (
        "Input contract cost per record",
        "python bench/gate_cost.py",
        _gate_cost,
    ),
    "snapshot_cost": (
        "Worker snapshot of one job's engine: cost and size",
        "python bench/snapshot_cost.py",
        _snapshot_cost,
    ),
    "agent_footprint": (
        "Node agent footprint",
        "python bench/agent_footprint.py",
        _agent,
    ),
    "streams_throughput": (
        "Stream worker throughput",
        "python bench/streams_throughput.py",
        _streams,
    ),
    "streams_throughput_offered120k": (
        "Stream worker throughput, offered 120k records/s",
        "python bench/streams_throughput.py --rate 120000 "
        "--out bench/results/streams_throughput_offered120k.json",
        _streams,
    ),
}


def fault_table(per_fault: dict[str, dict[str, Any]]) -> list[str]:
    """The per-fault campaign table (live and offline campaigns alike)."""
    rows = [
        "| fault | n | detected | det p50 / p90 / max | RCA after det p50 / p90 / max "
        "| rank | component | flow | false RC |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for fault, a in per_fault.items():
        if fault == "healthy":
            continue
        rows.append(
            f"| {fault} | {a['n']} | {_pct(a['detection_rate'])} | "
            f"{_num(a['detection_p50_s'])} / {_num(a['detection_p90_s'])} / "
            f"{_num(a['detection_max_s'])} | {_num(a['rca_after_detection_p50_s'])} / "
            f"{_num(a['rca_after_detection_p90_s'])} / "
            f"{_num(a['rca_after_detection_max_s'])} | {_pct(a['rank_accuracy'])} | "
            f"{_pct(a['component_accuracy'])} | {_pct(a['flow_accuracy'])} | "
            f"{a['false_root_causes']} |"
        )
    return rows


def _live_campaign(r: dict[str, Any]) -> list[str]:
    workers = (
        f"the two-stage path (1 split worker, {r['workers']} stage-1 workers "
        f"sharing {r['comm_groups']} comm groups per job, 1 resolver)"
        if r.get("two_stage")
        else f"{r['workers']} Faust workers"
    )
    catch = sorted(x["catch_up_s"] for x in r["rows"] if "catch_up_s" in x)
    lag = (
        f" The workers committed past a job's last record {catch[len(catch) // 2]:g} s "
        f"(median; max {catch[-1]:g} s) after it ended."
        if catch
        else ""
    )
    speed = r.get("speed", 1.0)
    pace, clock = (
        ("wall-clock pace", "")
        if speed == 1.0
        else (
            f"{speed:g} trace s per wall s, workers' clocks at the same speed",
            f", mapped to the trace clock (the pipeline's wall-clock delays "
            f"shrink by {speed:g} with them)",
        )
    )
    rows = [
        f"{r['ranks']} ranks per job, {r['seeds']} seed(s) per fault, "
        f"{r['duration_s']:g} simulated s per run published live ({pace}) into "
        f"a real broker, {r['concurrency']} jobs at a time, "
        f"{workers}; whole campaign {r['wall_s']} s, source "
        f"{r.get('commit', 'not recorded')}.{lag} "
        f"Latencies are broker timestamps of the anomaly / root-cause records"
        f"{clock} minus the injected onset (seconds).",
        "",
        *fault_table(r["per_fault"]),
    ]
    h = r["per_fault"].get("healthy")
    if h:
        rows += ["", f"Healthy: {h['n']} runs, {h['simulated_minutes']} simulated "
                 f"minutes, {h['false_root_causes']} false root cause(s), "
                 f"{h['false_anomalies']} false anomalies."]  # fmt: skip
    paper = r.get("paper")
    if paper:
        rows += [
            "",
            "| beside the paper (production, SOSP'25) | paper | here |",
            "|---|---|---|",
            "| hangs detected within 15 s | 90 % | "
            f"{_pct(paper['hangs_detected_within_15s'])} |",
            "| root causes within 20 s of onset | about 60 % | "
            f"{_pct(paper['root_causes_within_20s'])} |",
            "| root causes within 60 s of onset | 100 % | "
            f"{_pct(paper['root_causes_within_60s'])} |",
        ]
    if r.get("command"):
        rows += ["", f"This run: `{r['command']}`; CDFs in "
                 f"`bench/results/campaign_live_{r['ranks']}_cdf.png`."]  # fmt: skip
    return rows


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f} %"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


for _size in (64, 1024):
    RENDERERS[f"campaign_live_{_size}"] = (
        f"Live fault campaign, {_size} ranks (real broker, Faust workers)",
        f"python bench/campaign_live.py --ranks {_size}",
        _live_campaign,
    )
