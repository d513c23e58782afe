"""GPU check of the NCCL completion path (``nccl_done``); needs torch with CUDA.

    python -m mycroft.producers.torch.gpu_check [--steps 30] [--out FILE.json]

Runs one rank per GPU (two at most; NCCL refuses two ranks on one GPU, so a
one-GPU machine runs one) traced by ``MYCROFT_TORCH_TRACE=1``'s settings on
NCCL: a small DDP model (its bucket all-reduces are issued in C++) and
explicit all-reduces from Python, then reads the rings it kept. Sane when,
on every rank: each collective on the ring has exactly one OP_DONE, at or
after its OP_ISSUED, started before it ended, with a GPU duration between 0
and 10 s; DDP's buckets are on the ring; the hook took on every group and
counted no error and no lost or dropped completion. Prints and writes a
summary (per rank: ops, hook counts, the lag from issue to done and the GPU
durations). Exit status: 0 sane, 1 a check failed, 2 no GPU (nothing ran).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MAX_GPU_S = 10.0


def _rank(rank: int, world: int, port: int, steps: int, ring_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    from mycroft.producers import torch as mt  # noqa: PLC0415

    mt.install(ring_dir=ring_dir, keep_ring=True, beat_s=0.05)
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=4)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 1024, device="cuda")
    for _ in range(steps):
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
    torch.cuda.synchronize()
    time.sleep(1.0)  # the watchdog finds the last works, the beat drains them
    patcher = mt._state["patcher"]
    gpu = patcher.gpu
    stats = gpu.stats if gpu is not None else None
    gpu_done = [ref.gpu_done for ref in patcher._by_name.values()]
    dist.destroy_process_group()
    (Path(ring_dir) / f"hook-r{rank}.json").write_text(
        json.dumps(
            {
                "hook": None if stats is None else vars(stats),
                "groups_with_hook": sum(gpu_done),
                "groups": len(gpu_done),
            }
        )
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_ring(path: Path, hook: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Summary and problems of one rank's ring and hook counts."""
    from mycroft.producers.ring import RingReader  # noqa: PLC0415
    from mycroft.producers.ring_layout import OpDone, OpIssued  # noqa: PLC0415

    reader = RingReader(path)
    recs = reader.poll()
    reader.close()
    issued = {(r.comm, r.seq): r for r in recs if isinstance(r, OpIssued)}
    done: dict[tuple[int, int], list[OpDone]] = {}
    for r in recs:
        if isinstance(r, OpDone):
            done.setdefault((r.comm, r.seq), []).append(r)
    bad: list[str] = []
    lags, gpu_ms = [], []
    for key, op in issued.items():
        got = done.get(key, [])
        if len(got) != 1:
            bad.append(f"op {key}: {len(got)} OP_DONE")
            continue
        d = got[0]
        if d.ts_ns < op.ts_ns or not 0 <= d.ts_ns - d.start_ns <= MAX_GPU_S * 1e9:
            bad.append(
                f"op {key}: issued {op.ts_ns}, start {d.start_ns}, end {d.ts_ns}"
            )
        lags.append((d.ts_ns - op.ts_ns) / 1e6)
        gpu_ms.append((d.ts_ns - d.start_ns) / 1e6)
    stats = hook.get("hook") or {}
    if not stats:
        bad.append("no GPU completion hook (not NCCL, or the Flight Recorder is off)")
    elif stats["errors"] or stats["lost"] or stats["dropped"]:
        bad.append(f"hook counted problems: {stats}")
    if hook.get("groups_with_hook", 0) < hook.get("groups", 1):
        bad.append(
            f"hook took on {hook['groups_with_hook']} of {hook['groups']} groups"
        )
    if len(issued) < 2:
        bad.append(f"only {len(issued)} collectives on the ring")
    lags.sort()
    gpu_ms.sort()

    def pct(v: list[float], q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))], 3) if v else 0.0

    return {
        "ring": path.name,
        "collectives": len(issued),
        "hook": stats,
        "issue_to_done_ms": {"p50": pct(lags, 0.5), "p99": pct(lags, 0.99)},
        "gpu_ms": {"p50": pct(gpu_ms, 0.5), "max": pct(gpu_ms, 1.0)},
    }, bad


def main(argv: list[str] | None = None) -> int:
    """Run the check; the exit status of the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: PLC0415
        import torch.multiprocessing as tmp  # noqa: PLC0415
    except ImportError:
        print("gpu_check: torch is not installed; nothing was run", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing was run", file=sys.stderr)
        return 2
    world = min(2, torch.cuda.device_count())
    with tempfile.TemporaryDirectory(prefix="mycroft-torch-gpu-") as ring_dir:
        job = (world, _free_port(), args.steps, ring_dir)
        tmp.spawn(_rank, job, nprocs=world)  # type: ignore[attr-defined,no-untyped-call]
        ranks, problems = [], []
        for rank in range(world):
            hook = json.loads((Path(ring_dir) / f"hook-r{rank}.json").read_text())
            ring = next(Path(ring_dir).glob(f"torch-r{rank}-p*.ring"))
            summary, bad = check_ring(ring, hook)
            ranks.append(summary)
            problems += [f"rank {rank}: {b}" for b in bad]
    doc = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "world": world,
        "ranks": ranks,
        "problems": problems[:50],
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
