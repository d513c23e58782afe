"""Per-callback cost of Mycroft's NCCL profiler plugin in ns, via the fake-NCCL harness.

``fake_nccl PLUGIN ABI --bench OPS STEPS`` drives the exported table as NCCL
does (Coll -> 2 KernelCh, a send and a recv ProxyOp of STEPS ProxySteps each)
and times every callback on its own with the TSC (``rdtsc`` between
``lfence``; the timer's own cost, the median of back-to-back reads, is
subtracted). The plugin's tick (ring writes) runs every 64 ops outside the
timed calls, as its own thread does in a job. Several runs per ABI; the
median of the runs' medians is reported, and the largest p99.

The drop check drives the plugin with ``nccl_like --rate`` (NCCL 2.30's call
sequence and threads, the default 100 ms tick and default pools) at 20,000 to
100,000 ops/s, collectives and all-to-all, and counts what reached the ring:
every op must get its OP_DONE and the plugin must count no drop.

From those: a send and a recv proxy step (startEvent, its states, stopEvent),
what one op costs on the proxy thread, and what fraction of the proxy's time
a step is for a given step size and link speed. NCCL's example plugin cost
users 0.1-1.1 % (2.29.7) and 4-13 % (2.31.2) of 128 KB-4 MB AllReduce time on
8 A100 (NVIDIA/nccl#2355, Group|Coll|P2p|KernelCh events); those numbers are
quoted, not measured here. Writes ``bench/results/nccl_plugin_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "producers" / "nccl"

SEND_STEP = (
    "ProxyStep.startEvent",
    "ProxyStep.SendGPUWait",
    "ProxyStep.SendPeerWait",
    "ProxyStep.SendWait",
    "ProxyStep.stopEvent",
)
RECV_STEP = (
    "ProxyStep.startEvent",
    "ProxyStep.RecvWait",
    "ProxyStep.RecvFlushWait",
    "ProxyStep.RecvGPUWait",
    "ProxyStep.stopEvent",
)
KERNEL_CH = ("KernelCh.startEvent", "KernelCh.KernelChStop", "KernelCh.stopEvent")
COLL = ("Coll.startEvent", "Coll.stopEvent")
PROXY_OP = ("ProxyOp.startEvent", "ProxyOp.stopEvent")
STEP_BYTES = (131072, 524288)
"""Network step sizes: NCCL's SIMPLE step is buffSize/NCCL_STEPS (4 MiB / 8 = 512 KiB
by default); 128 KiB for small messages."""
LINK_GBPS = (200, 400)
REPORTED = {
    "source": "NVIDIA/nccl#2355 (NCCL's example profiler plugin, 8x A100, "
    "Group|Coll|P2p|KernelCh, 128 KB-4 MB AllReduce)",
    "nccl_2.29.7_pct": [0.1, 1.1],
    "nccl_2.31.2_pct": [4.3, 13.3],
}


def build(build_dir: Path) -> Path:
    """``make`` the plugin and the harness into ``build_dir``."""
    subprocess.run(["make", "-s", "-C", str(SOURCE), f"BUILD={build_dir}"], check=True)
    return build_dir


def one_run(build_dir: Path, abi: int, ops: int, steps: int) -> dict[str, Any]:
    """One harness ``--bench`` run; its JSON."""
    with tempfile.TemporaryDirectory(prefix="mycroft-nccl-bench-") as ring_dir:
        env = dict(os.environ, MYCROFT_NCCL_TICK_MS="0", MYCROFT_NCCL_RING_DIR=ring_dir)
        out = subprocess.run(
            [
                str(build_dir / "fake_nccl"),
                str(build_dir / "libnccl-profiler-mycroft.so"),
                str(abi),
                "--bench",
                str(ops),
                str(steps),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def combine(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per callback: median of the runs' medians, largest p99."""
    names = runs[0]["callbacks"].keys()
    return {
        name: {
            "median_ns": round(
                statistics.median(r["callbacks"][name]["median_ns"] for r in runs), 1
            ),
            "p99_ns": round(max(r["callbacks"][name]["p99_ns"] for r in runs), 1),
        }
        for name in names
    }


def total(cb: dict[str, dict[str, float]], names: tuple[str, ...]) -> float:
    """Sum of the callbacks' medians."""
    return round(sum(cb[n]["median_ns"] for n in names), 1)


def derived(cb: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per step and per op costs, and a step's share of the proxy's time."""
    send, recv = total(cb, SEND_STEP), total(cb, RECV_STEP)
    share = {
        f"{size // 1024}KiB@{gbps}Gbps": round(
            100 * max(send, recv) / (size * 8 / gbps), 3
        )
        for size in STEP_BYTES
        for gbps in LINK_GBPS
    }
    return {
        "send_step_ns": send,
        "recv_step_ns": recv,
        "coll_ns": total(cb, COLL),
        "proxy_op_ns": total(cb, PROXY_OP),
        "kernel_ch_ns": total(cb, KERNEL_CH),
        "intra_node_op_ns": {
            str(ch): round(total(cb, COLL) + ch * total(cb, KERNEL_CH), 1)
            for ch in (2, 8, 32)
        },
        "step_share_of_transfer_pct": share,
    }


RATES = (20_000, 50_000, 100_000)
"""Op rates of the drop check, ops/s (an all-to-all is one P2p op per peer and
direction, so a busy MoE job reaches tens of thousands)."""
RATE_RING_SLOTS = 1 << 23
"""Ring slots for the drop check: the run is read after it ends, so the ring holds
all of it; the agent reads a job's ring every tick instead (``records_per_s``
says how fast it must)."""


def rate_run(
    build_dir: Path, rate: int, seconds: float, peers: int, release: str = "2.30"
) -> dict[str, Any]:
    """``nccl_like --rate``: ops at ``rate`` for ``seconds`` with the default tick
    and pools; what the ring then holds and what the plugin counted lost."""
    from mycroft.producers.ring import RingReader  # noqa: PLC0415 - venv only
    from mycroft.producers.ring_layout import Beat, OpDone, OpIssued  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="mycroft-nccl-rate-") as ring_dir:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MYCROFT_NCCL_")}
        env.update(
            MYCROFT_NCCL_RING_DIR=ring_dir,
            MYCROFT_NCCL_RING_SLOTS=str(RATE_RING_SLOTS),
        )
        cmd = [
            str(build_dir / "nccl_like"),
            str(build_dir / "libnccl-profiler-mycroft.so"),
            "--release",
            release,
            "--rate",
            str(rate),
            "--seconds",
            str(seconds),
        ]
        if peers:
            cmd += ["--p2p-peers", str(peers)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        driver: dict[str, Any] = json.loads(
            next(ln for ln in out.stdout.splitlines() if ln.startswith("{"))
        )
        records: list[Any] = []
        overwritten = 0
        for path in sorted(Path(ring_dir).glob("*.ring")):
            reader = RingReader(path)
            while reader.lag() > 0:
                records += reader.poll()
            overwritten += reader.overwritten
    beats = [r for r in records if isinstance(r, Beat)]
    last = beats[-1]
    done = sum(isinstance(r, OpDone) for r in records)
    return {
        "rate_ops_per_s": rate,
        "p2p_peers": peers,
        "ops_issued": driver["ops"],
        "seconds": driver["seconds"],
        "op_done": done,
        "op_issued_records": sum(isinstance(r, OpIssued) for r in records),
        "dropped_ops": last.dropped_ops,
        "dropped_flows": last.dropped_flows,
        "dropped_comms": last.dropped_comms,
        "abandoned_ops": last.abandoned_ops,
        "ring_overwritten": overwritten,
        "records_per_s": round(len(records) / driver["seconds"]),
        "lost": driver["ops"] - done,
    }


def machine() -> dict[str, Any]:
    """Where the numbers come from."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "arch": platform.machine()}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=16, help="proxy steps per flow")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--rate-seconds", type=float, default=2.0, help="length of each drop-check run"
    )
    ap.add_argument(
        "--out", type=Path, default=ROOT / "bench/results/nccl_plugin_overhead.json"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mycroft-nccl-build-") as tmp:
        build_dir = build(Path(tmp))
        per_abi: dict[str, Any] = {}
        for abi in (6, 5, 4):
            runs = [
                one_run(build_dir, abi, args.ops, args.steps) for _ in range(args.runs)
            ]
            cb = combine(runs)
            per_abi[f"v{abi}"] = {
                "callbacks": cb,
                **derived(cb),
                "timer_overhead_ns": runs[0]["timer_overhead_ns"],
                "tick_us_per_64_ops": statistics.median(
                    r["tick_us_per_64_ops"] for r in runs
                ),
            }
        rates = [
            rate_run(build_dir, rate, args.rate_seconds, peers)
            for peers in (0, 8)
            for rate in RATES
        ]
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    result = {
        "setup": f"fake-NCCL harness, {args.runs} runs x {args.ops} ops x "
        f"{args.steps} steps per flow, each callback timed alone (rdtsc)",
        "machine": machine(),
        "commit": commit,
        "command": "python bench/nccl_plugin_overhead.py",
        "abis": per_abi,
        "rates": {
            "setup": "nccl_like --rate (NCCL 2.30's call sequence): one communicator, "
            "AllReduce of 1 channel x 2 steps per flow, or all-to-all as one P2p op "
            "per peer and direction (p2p_peers), default tick and pools, "
            f"{args.rate_seconds} s per run; the ring enlarged to hold the whole run",
            "runs": rates,
        },
        "reported_example_plugin": REPORTED,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for r in rates:
        print(
            f"{r['rate_ops_per_s']} ops/s (p2p peers {r['p2p_peers']}): "
            f"{r['ops_issued']} issued, {r['op_done']} OP_DONE, dropped ops "
            f"{r['dropped_ops']}, flows {r['dropped_flows']}"
        )
    v6 = per_abi["v6"]
    print(
        f"v6: send step {v6['send_step_ns']} ns, recv step {v6['recv_step_ns']} ns, "
        f"KernelCh {v6['kernel_ch_ns']} ns, Coll {v6['coll_ns']} ns -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
