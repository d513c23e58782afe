"""An expert-parallel MoE layer on gloo: uneven all-to-alls every step.

Not a test module. One rank: ``python moe_job.py --iters N ...`` (options:
``train_job.parse``). Each rank holds one expert. Every step draws a routing
of each rank's ``--batch`` tokens over the experts (the same seeded draw on
every rank, as a router's split sizes are exchanged in a real job), then
runs ``all_to_all_single`` with those split sizes (dispatch), an expert
matmul, the reverse ``all_to_all_single`` (combine: each rank sends back
what its expert got, so input sizes differ by rank and by step) and the
gradient all-reduce of the expert's weights.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.unit.torch import train_job


def routing(step: int, world: int, tokens: int) -> list[list[int]]:
    """``m[i][j]``: tokens rank ``i`` sends to expert ``j`` at ``step``; each
    row sums to ``tokens``, the columns (experts' loads) differ."""
    import torch  # noqa: PLC0415

    gen = torch.Generator().manual_seed(1000 + step)
    popular = torch.rand(world, generator=gen) ** 2 + 0.05
    m = []
    for _ in range(world):
        share = popular * torch.rand(world, generator=gen)
        counts = (share / share.sum() * tokens).floor().to(torch.int64)
        counts[0] += tokens - int(counts.sum())
        m.append(counts.tolist())
    return m


def moe_step(args: argparse.Namespace, step: int, expert: Any) -> None:
    """One MoE layer forward (dispatch, expert, combine) and its grad sync."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    rank, world = dist.get_rank(), dist.get_world_size()
    m = routing(step, world, args.batch)
    send = m[rank]
    got = [m[i][rank] for i in range(world)]
    x = torch.randn(args.batch, args.width)
    inbox = torch.empty(sum(got), args.width)
    dist.all_to_all_single(inbox, x, output_split_sizes=got, input_split_sizes=send)
    y = inbox @ expert
    back = torch.empty(args.batch, args.width)
    dist.all_to_all_single(back, y, output_split_sizes=send, input_split_sizes=got)
    grad = y.T @ inbox / max(len(inbox), 1)
    dist.all_reduce(grad)


def main(argv: Sequence[str] | None = None) -> int:
    """One rank of the MoE job."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    args = train_job.parse(__doc__, argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    expert = torch.randn(args.width, args.width) / args.width**0.5
    t0 = time.perf_counter()
    for step in range(args.iters):
        moe_step(args, step, expert)
        if args.iter_sleep_s:
            time.sleep(args.iter_sleep_s)
    print(f"rank {dist.get_rank()} iters {args.iters} s {time.perf_counter() - t0:.3f}")
    dist.destroy_process_group()
    return 0


def launch(
    args: Sequence[str], world: int, env: Mapping[str, str], log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` ranks of this script; stop them with ``torch_job.stop``."""
    return train_job.launch(Path(__file__).resolve(), args, world, env, log_dir)


if __name__ == "__main__":
    sys.exit(main())
