"""Cost of the tracer's Flight Recorder poll (CPU time of its poll thread).

``python bench/torch_fr_poll.py [--out bench/results/torch_fr_poll.json]``

1. One gloo process per ring size (``TORCH_FR_BUFFER_SIZE`` 128, the
   tracer's default, and 2000, torch's): the ring filled with all-reduces,
   then the median CPU time of a poll with nothing new (header only) and of
   a poll that reads the whole ring.
2. A 2-rank gloo DDP loop traced with ``mt.install()`` (3 Linear(256, 256),
   2 buckets a step): per-poll CPU time over the run, split into polls that
   read entries and polls that did not, and the step time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _median_cpu_us(fn: Any, n: int) -> float:
    xs = []
    for _ in range(n):
        t0 = time.thread_time_ns()
        fn()
        xs.append(time.thread_time_ns() - t0)
    return statistics.median(xs) / 1e3


def ring_cost(entries: int) -> dict[str, Any]:
    """One process: poll costs with a full ring of ``entries``."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(entries)
    from mycroft.producers import torch as mt  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp())
    mt.install(ring_dir=tmp / "rings", beat_s=3600)
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp / "store"), 1), rank=0, world_size=1
    )
    poller = mt._state["patcher"].poller
    t = torch.ones(8)
    for _ in range(entries + 10):
        dist.all_reduce(t)
    poller.flush()
    header = _median_cpu_us(poller.poll, 500)

    def read() -> None:
        for src in poller.sources:
            src.last_rid -= 1  # one entry looks new: the whole ring is read
        poller.flush()

    full = _median_cpu_us(read, 50)
    dist.destroy_process_group()
    mt.uninstall()
    return {"fr_entries": entries, "header_poll_us": header, "read_poll_us": full}


def ddp_rank(steps: int) -> dict[str, Any]:
    """One rank of the traced DDP loop; returns the poller's numbers."""
    from mycroft.producers import torch as mt  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp())
    mt.install(ring_dir=tmp / "rings")
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    w = 256
    net = torch.nn.Sequential(*(torch.nn.Linear(w, w) for _ in range(3)))
    cap_mb = (w * w + w) * 4 / 2**20 * 1.1
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=cap_mb)
    t0 = time.perf_counter()
    for _ in range(steps):
        model(torch.randn(32, w)).square().mean().backward()
    step_ms = (time.perf_counter() - t0) / steps * 1e3
    poller = mt._state["patcher"].poller
    st = poller.stats
    dist.destroy_process_group()
    mt.uninstall()
    idle = st.polls - st.reads
    return {
        "rank": int(os.environ["RANK"]),
        "steps": steps,
        "step_ms": round(step_ms, 3),
        "polls": st.polls,
        "reads": st.reads,
        "entries": st.entries,
        "written": st.emitted,
        "lost": st.lost,
        "poll_cpu_us_mean": round(st.poll_ns_total / max(st.polls, 1) / 1e3, 1),
        "poll_cpu_us_median": round(statistics.median(st.poll_ns) / 1e3, 1),
        "read_poll_cpu_us_mean": round(st.read_ns_total / max(st.reads, 1) / 1e3, 1),
        "header_poll_cpu_us_mean": round(
            (st.poll_ns_total - st.read_ns_total) / max(idle, 1) / 1e3, 1
        ),
        "poll_cpu_share_of_run": round(st.poll_ns_total / (step_ms * steps * 1e6), 4),
    }


def _spawn(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def main(argv: list[str] | None = None) -> int:
    """Run both parts; print and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="bench/results/torch_fr_poll.json")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ring", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ddp-rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ring:
        print(json.dumps(ring_cost(args.ring)))
        return 0
    if args.ddp_rank:
        print(json.dumps(ddp_rank(args.steps)))
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FR")}
    rings = [_spawn(["--ring", str(n)], env) for n in (128, 2000)]
    port = 29500 + os.getpid() % 1000
    procs = []
    for rank in range(2):
        renv = dict(env, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
        renv["MASTER_PORT"] = str(port)
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--ddp-rank", "--steps", str(args.steps)],
                env=renv,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    ddp = [
        json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1])
        for p in procs
    ]
    result = {"rings": rings, "ddp": ddp}
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
