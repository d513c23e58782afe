"""The training loop, fault options and launcher of the DDP, FSDP2 and TP jobs.

Not a test module. ``ddp_job.py``, ``fsdp_job.py`` and ``tp_job.py`` each
build a model and hand it to :func:`main`, which initializes gloo from the
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), trains, and on a
peer's error waits (as under an elastic agent) so that the state stays
observable. The scripts call no collective in the loop themselves.

Faults (from iteration ``--fault-at`` on ``--culprit``), all injected in
backward by a :class:`Fault` layer the job places between two layers, so
that the later layers' backward collectives were issued and the earlier
layers' were not: ``none``; ``straggler`` (sleeps ``--delay-s`` in every
backward); ``stall`` (sleeps until killed); ``crash`` (``os._exit(1)``).

Healthy rhythm: ``--checkpoint-every N --checkpoint-s S`` makes rank 0
sleep S seconds after every N iterations, as a rank-0 checkpoint does,
while the other ranks go on into the next iteration's collectives and wait.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

SCENARIOS = ("none", "straggler", "stall", "crash")
ROOT = Path(__file__).resolve().parents[3]

Build = Callable[[argparse.Namespace, Any], Any]
"""``build(args, fault) -> model`` on the initialized default group, with
``fault`` (a :func:`fault_layer`) placed inside the model."""


def fault_layer(args: argparse.Namespace, state: dict[str, int]) -> Any:
    """An identity layer whose backward injects ``args.scenario`` on the
    culprit once ``state["it"]`` reached ``args.fault_at`` (a no-op elsewhere)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    armed = dist.get_rank() == args.culprit and args.scenario != "none"

    class _Inject(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            if armed and state["it"] >= args.fault_at:
                inject(args)
            return grad

    class Fault(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return _Inject.apply(x)  # type: ignore[no-untyped-call]  # torch: untyped

    return Fault()


def inject(args: argparse.Namespace) -> None:
    """Do the scenario's fault once, on the calling thread."""
    if args.scenario == "straggler":
        time.sleep(args.delay_s)
    elif args.scenario == "stall":
        time.sleep(3600)
    elif args.scenario == "crash":
        os._exit(1)


def train(build: Build, args: argparse.Namespace, state: dict[str, int]) -> None:
    """Run the loop on the model ``build`` makes; ``state["it"]`` follows it."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = build(args, fault_layer(args, state))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(rank)
    t0 = time.perf_counter()
    for it in range(args.iters):
        state["it"] = it
        x = torch.randn(args.batch, args.width, requires_grad=True)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.iter_sleep_s:
            time.sleep(args.iter_sleep_s)
        if (
            rank == 0
            and args.checkpoint_every
            and (it + 1) % args.checkpoint_every == 0
        ):
            time.sleep(args.checkpoint_s)
    print(f"rank {rank} iters {args.iters} s {time.perf_counter() - t0:.3f}")


def parse(doc: str | None, argv: Sequence[str] | None) -> argparse.Namespace:
    """The options every job takes."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--scenario", choices=SCENARIOS, default="none")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--fault-at", type=int, default=10)
    ap.add_argument("--culprit", type=int, default=1)
    ap.add_argument("--delay-s", type=float, default=0.4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iter-sleep-s", type=float, default=0.0)
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--checkpoint-s", type=float, default=2.5)
    return ap.parse_args(argv)


def main(build: Build, doc: str | None, argv: Sequence[str] | None = None) -> int:
    """One rank of the job whose model ``build`` makes."""
    import torch.distributed as dist  # noqa: PLC0415

    args = parse(doc, argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    state = {"it": 0}
    try:
        train(build, args, state)
    except Exception as exc:  # noqa: BLE001 - the survivor's reaction is the point
        print(f"rank {dist.get_rank()} error: {exc}".splitlines()[0], flush=True)
        while True:
            time.sleep(1)
    dist.destroy_process_group()
    return 0


def launch(  # noqa: PLR0913 - the script and launch's own arguments
    script: Path,
    args: Sequence[str],
    world: int,
    env: Mapping[str, str],
    log_dir: Path,
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` ranks of ``script``; stop them with ``torch_job.stop``."""
    from tests.unit.torch import harness  # noqa: PLC0415

    port = harness.job().free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
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
            PYTHONPATH=path,
        )
        with open(log_dir / f"rank{rank}.log", "wb") as out:
            cmd = [sys.executable, str(script), *args]
            procs.append(
                subprocess.Popen(cmd, env=renv, stdout=out, stderr=subprocess.STDOUT)
            )
    return procs
