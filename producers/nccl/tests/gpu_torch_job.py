"""A small PyTorch NCCL job for ``gpu_check.sh``: timed AllReduces, one line of JSON.

Run under ``torch.distributed.run`` (one process per GPU; one GPU is a world
of 1). Every size from 128 KiB to 4 MiB is all-reduced ``--iters`` times after
``--warmup``; rank 0 prints ``{"nccl": ..., "world": ..., "us": {size: mean}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

SIZES = [128 << 10, 512 << 10, 1 << 20, 4 << 20]


def timed(x: torch.Tensor, iters: int) -> float:
    """Mean microseconds of one all_reduce of ``x``."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> int:
    """Run the job; print the JSON line on rank 0."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    out: dict[str, float] = {}
    for size in SIZES:
        x = torch.ones(size // 4, device="cuda", dtype=torch.float32)
        timed(x, args.warmup)
        out[str(size)] = round(timed(x, args.iters), 2)
    if dist.get_rank() == 0:
        version = ".".join(str(v) for v in torch.cuda.nccl.version())
        line = {"nccl": version, "world": dist.get_world_size(), "us": out}
        print(json.dumps(line), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
