"""A small DistributedDataParallel job on gloo with faults, and its launcher.

Not a test module. One rank: ``python ddp_job.py --scenario S ...`` (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment). The model is a
3-layer MLP under DDP with buckets of about one layer each, so every backward
issues 3 bucket all-reduces from DDP's C++ reducer; the script itself calls
no collective in the loop.

Scenarios (from iteration ``--fault-at`` on ``--culprit``), all injected
in backward by a hook on the first layer, i.e. after the later layers'
buckets were issued and before the first layer's:
``none``; ``straggler`` (sleeps ``--delay-s`` in every backward);
``stall`` (sleeps until killed, before its last bucket all-reduce);
``crash`` (``os._exit(1)`` mid-step).
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCENARIOS = ("none", "straggler", "stall", "crash")


def _fault_hook(args: argparse.Namespace, state: dict[str, int]) -> Any:
    def hook(_module: Any, _grad_in: Any, _grad_out: Any) -> None:
        if state["it"] < args.fault_at:
            return
        if args.scenario == "straggler":
            time.sleep(args.delay_s)
        elif args.scenario == "stall":
            time.sleep(3600)
        elif args.scenario == "crash":
            os._exit(1)

    return hook


def train(args: argparse.Namespace) -> None:
    """Run the DDP loop on the initialized default group."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    rank = dist.get_rank()
    torch.manual_seed(0)
    w = args.width
    layers = [torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w)]
    layers += [torch.nn.ReLU(), torch.nn.Linear(w, w)]
    net = torch.nn.Sequential(*layers)
    state = {"it": 0}
    if rank == args.culprit and args.scenario != "none":
        net[0].register_full_backward_hook(_fault_hook(args, state))
    layer_mb = (w * w + w) * 4 / 2**20
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=layer_mb * 1.1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(rank)
    t0 = time.perf_counter()
    for it in range(args.iters):
        state["it"] = it
        x = torch.randn(args.batch, w, requires_grad=True)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.iter_sleep_s:
            time.sleep(args.iter_sleep_s)
    print(f"rank {rank} iters {args.iters} s {time.perf_counter() - t0:.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    """One rank: init gloo, train, and on a peer's error wait (as under an
    elastic agent) so that the state stays observable."""
    import torch.distributed as dist  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scenario", choices=SCENARIOS, default="none")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--fault-at", type=int, default=10)
    ap.add_argument("--culprit", type=int, default=1)
    ap.add_argument("--delay-s", type=float, default=0.4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iter-sleep-s", type=float, default=0.0)
    args = ap.parse_args(argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    try:
        train(args)
    except Exception as exc:  # noqa: BLE001 - the survivor's reaction is the point
        print(f"rank {dist.get_rank()} error: {exc}".splitlines()[0], flush=True)
        while True:
            time.sleep(1)
    dist.destroy_process_group()
    return 0


def launch(
    args: Sequence[str], world: int, env: Mapping[str, str], log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` ranks of this script; stop them with ``torch_job.stop``."""
    from tests.unit.torch import harness  # noqa: PLC0415

    port = harness.job().free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world):
        renv = dict(env)
        renv.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONUNBUFFERED="1",
        )
        with open(log_dir / f"rank{rank}.log", "wb") as out:
            cmd = [sys.executable, str(Path(__file__).resolve()), *args]
            procs.append(
                subprocess.Popen(cmd, env=renv, stdout=out, stderr=subprocess.STDOUT)
            )
    return procs


if __name__ == "__main__":
    sys.exit(main())
