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
