"""RESULTS.md sections of the PyTorch benchmarks (used by report.py)."""

from __future__ import annotations

from typing import Any

from render_perf import Renderer


def _overhead(r: dict[str, Any]) -> list[str]:
    cost, target = r["wrapper_cost_us"], r["target_pct"]
    q1, q3 = r["overhead_pct_quartiles"]
    return [
        r["setup"] + f"; {r['runs']} runs of {r['iters_per_run']} iterations.",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| ms per iteration (median) | {r['ms_per_iter_median']} | - |",
        f"| overhead, traced vs paused blocks (median of {r['quads']} ABBA quads) | "
        f"{r['overhead_pct_median']} % (quartiles {q1} .. {q3} %) | <= {target} % |",
        f"| tracer cost per collective call | {cost['median_us']} us (a plain call: "
        f"{cost['plain_call_us']} us) | - |",
        "| projected overhead from the per-call cost | "
        f"{r['projected_overhead_pct']} % | <= {target} % |",
        "",
        "Blocks of the same run are compared (ABBA cancels drift); whole runs "
        "against whole runs spread by 10 % and more on this machine.",
    ]


def _verdict(v: dict[str, Any] | None) -> str:
    if v is None:
        return "-"
    ranks = ",".join(str(x) for x in v.get("ranks", []))
    if v["verdict"] == "crash":
        return f"crash ({v['says'][:40]})"
    if v["verdict"] == "none":
        return "nothing named"
    extra = f" {v['component']}/{v['kind']}" if "component" in v else ""
    return f"{v['verdict']} {{{ranks}}}{extra}"


def _fr_compare(r: dict[str, Any]) -> list[str]:
    rows = [
        r["setup"] + ".",
        "",
        "| scenario | expected | PyTorch fr_trace (raw dumps) | fr_trace (pg_config "
        "repaired) | fr_trace repaired, --allow-incomplete-ranks | Mycroft (pickle) "
        "| Mycroft (JSON dumps) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in r["scenarios"].items():
        e = s["expected"]
        rows.append(
            f"| {name} | rank {e['rank']} {e['component']}/{e['kind']} | "
            f"{_verdict(s.get('fr_trace_raw'))} | "
            f"{_verdict(s.get('fr_trace_fixed'))} | "
            f"{_verdict(s.get('fr_trace_fixed_incomplete'))} | "
            f"{_verdict(s.get('mycroft'))} | {_verdict(s.get('mycroft_json_dumps'))} |"
        )
    return rows


def _fr_poll(r: dict[str, Any]) -> list[str]:
    lines = [
        "The tracer's Flight Recorder poll (`producers/torch/frlive.py`): CPU "
        "per poll of a full ring (header only, and reading every entry), and "
        "over a 2-rank gloo DDP loop traced with `MYCROFT_TORCH_TRACE=1`.",
        "",
        "| FR entries | header-only poll (us) | reading poll (us) |",
        "|---|---|---|",
        *(
            f"| {x['fr_entries']} | {x['header_poll_us']} | {x['read_poll_us']} |"
            for x in r["rings"]
        ),
        "",
        "| rank | steps | step (ms) | polls | reads | entries written / lost | "
        "CPU per poll, mean / median (us) | poll CPU share of run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {x['rank']} | {x['steps']} | {x['step_ms']} | {x['polls']} | "
        f"{x['reads']} | {x['written']} / {x['lost']} | {x['poll_cpu_us_mean']} / "
        f"{x['poll_cpu_us_median']} | {x['poll_cpu_share_of_run']:.1%} |"
        for x in r["ddp"]
    ]
    return lines


RENDERERS: dict[str, Renderer] = {
    "torch_fr_poll": (
        "PyTorch Flight Recorder live poll: cost",
        "python bench/torch_fr_poll.py",
        _fr_poll,
    ),
    "torch_overhead": (
        "PyTorch tracer overhead (4 gloo ranks)",
        "python bench/torch_overhead.py",
        _overhead,
    ),
    "torch_fr_compare": (
        "Flight Recorder dumps: Mycroft beside PyTorch's fr_trace",
        "python bench/torch_fr_compare.py",
        _fr_compare,
    ),
}
