"""A small real gloo training job with fault injection, and its 4-rank launcher.

One rank: ``python bench/torch_job.py rank --scenario S ...`` (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment). Each iteration
runs an MLP forward/backward, all-reduces the gradients on the world group
and a small tensor on a second group ``dp`` (same ranks), then steps.

Scenarios (fault at iteration ``--fault-at`` on ``--culprit``):
``none``; ``stall`` (sleeps before its collective until killed);
``straggler`` (sleeps ``--delay-s`` before each all-reduce from then on);
``crash`` (``os._exit(1)``); ``mismatch`` (all-reduces a different size);
``order`` (issues the ``dp`` all-reduce before the world one: deadlock).

Survivors that get an error keep running idle (``--on-error wait``), as
under an elastic agent waiting to restart, so their state stays observable.
With ``--fr-dir`` every rank dumps its Flight Recorder (pickle and JSON,
no stacks) after ``--fr-stall-s`` without progress, on an error, and at the
end, to ``<fr-dir>/{pickle,json}/rank_<r>``.

Launcher: :func:`launch` starts the ranks with a hard timeout and kills only
the processes it started.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCENARIOS = ("none", "stall", "straggler", "crash", "mismatch", "order")


class FlightDumper:
    """Writes this rank's Flight Recorder on demand and after a stall."""

    def __init__(self, out: Path, rank: int, stall_s: float) -> None:
        self.out, self.rank, self.stall_s = out, rank, stall_s
        self.progress = 0
        self._last_change = time.monotonic()
        self._seen = -1
        self._dumped_at = -1

    def dump(self, sub: str = "") -> None:
        """Write the pickle and JSON dumps (``sub``: a subfolder, e.g. warm-up)."""
        import torch  # noqa: PLC0415

        c10d: Any = torch._C._distributed_c10d
        blobs = {
            "pickle": c10d._dump_fr_trace(True, False, False),
            "json": c10d._dump_fr_trace_json(True, False),
        }
        for kind, data in blobs.items():
            folder = self.out / sub / kind if sub else self.out / kind
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".rank_{self.rank}.tmp"
            tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
            tmp.replace(folder / f"rank_{self.rank}")

    def watch(self) -> None:
        """Daemon loop: dump once per stall of ``stall_s`` without progress."""
        while True:
            time.sleep(0.2)
            if self.progress == 0:
                continue  # armed after the first iteration (startup is slow)
            if self.progress != self._seen:
                self._seen, self._last_change = self.progress, time.monotonic()
            elif (
                time.monotonic() - self._last_change > self.stall_s
                and self._dumped_at != self._seen
            ):
                self._dumped_at = self._seen
                self.dump()


def _ab_switch(block: int, blocks: list[float]) -> None:
    """Close the running block's time; trace block ``block`` or not (ABBA).

    Every rank switches at the same iteration, so op numbers stay aligned.
    """
    from mycroft.producers import torch as mt  # noqa: PLC0415

    now = time.perf_counter()
    if blocks:
        blocks[-1] = now - blocks[-1]
    if block < 0:
        return
    if block % 4 in (0, 3):
        mt.resume()
    else:
        mt.pause()
    blocks.append(time.perf_counter())


def _train(args: argparse.Namespace, dumper: FlightDumper | None) -> None:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    rank, world = dist.get_rank(), dist.get_world_size()
    dp = dist.new_group(list(range(world)), group_desc="dp")
    torch.manual_seed(rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, args.width),
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    small = torch.zeros(8)
    culprit = rank == args.culprit
    t_start, cpu_start = time.perf_counter(), time.thread_time()
    blocks: list[float] = []
    for it in range(args.iters):
        if args.ab_block and it % args.ab_block == 0:
            _ab_switch(it // args.ab_block, blocks)
        x = torch.randn(args.batch, args.width)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        torch.cat([p.grad.reshape(-1) for p in model.parameters()], out=flat)
        fault = culprit and it >= args.fault_at
        if fault and args.scenario == "stall":
            time.sleep(3600)
        if fault and args.scenario == "straggler":
            time.sleep(args.delay_s)
        if fault and it == args.fault_at and args.scenario == "crash":
            os._exit(1)
        buf = flat
        if fault and it == args.fault_at and args.scenario == "mismatch":
            buf = torch.zeros(flat.numel() * 2)
        if fault and it == args.fault_at and args.scenario == "order":
            dist.all_reduce(small, group=dp)
            dist.all_reduce(buf)
        else:
            dist.all_reduce(buf)
            dist.all_reduce(small, group=dp)
        opt.step()
        if dumper is not None:
            dumper.progress = it + 1
            if it == 0:
                dumper.dump("warm")  # pays any first-dump cost up front
        if args.iter_sleep_s:
            time.sleep(args.iter_sleep_s)
    elapsed = time.perf_counter() - t_start
    cpu = time.thread_time() - cpu_start  # this (training) thread only
    if args.ab_block:
        _ab_switch(-1, blocks)
        print("blocks_s " + " ".join(f"{b:.6f}" for b in blocks), flush=True)
    print(
        f"rank {rank} iters {args.iters} elapsed_s {elapsed:.6f} cpu_s {cpu:.6f}",
        flush=True,
    )
    dist.barrier()


def rank_main(args: argparse.Namespace) -> int:
    """Run one rank of the job."""
    import torch.distributed as dist  # noqa: PLC0415

    if args.trace:
        from mycroft.producers import torch as mt  # noqa: PLC0415

        mt.install()
    rank = int(os.environ["RANK"])
    dumper = (
        FlightDumper(Path(args.fr_dir), rank, args.fr_stall_s) if args.fr_dir else None
    )
    dist.init_process_group(
        "gloo", timeout=__import__("datetime").timedelta(seconds=args.pg_timeout_s)
    )
    if dumper is not None:
        threading.Thread(target=dumper.watch, daemon=True).start()
    try:
        _train(args, dumper)
    except Exception as exc:  # noqa: BLE001 - the survivor's reaction is the point
        print(f"rank {rank} error: {exc}".splitlines()[0], flush=True)
        if dumper is not None:
            dumper.dump()
        if args.on_error == "exit":
            return 1
        while True:
            time.sleep(1)
    if dumper is not None:
        dumper.dump()
    dist.destroy_process_group()
    return 0


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    job_args: Sequence[str],
    world: int = 4,
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    python: Sequence[str] = (sys.executable,),
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` ranks of this script; the caller must :func:`stop` them."""
    port = free_port()
    procs = []
    for rank in range(world):
        renv = dict(os.environ if env is None else env)
        renv.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONUNBUFFERED="1",
        )
        out = (
            open(log_dir / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed below
            if log_dir
            else subprocess.DEVNULL
        )
        cmd = [*python, str(Path(__file__).resolve()), "rank", *job_args]
        procs.append(
            subprocess.Popen(cmd, env=renv, stdout=out, stderr=subprocess.STDOUT)
        )
        if log_dir:
            out.close()  # type: ignore[union-attr]
    return procs


def stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, exactly the processes in ``procs``."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def wait_all(
    procs: Sequence[subprocess.Popen[bytes]], timeout_s: float
) -> list[int | None]:
    """Wait up to ``timeout_s`` for every process; return their exit codes."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            break
    return [p.poll() for p in procs]


def parser() -> argparse.ArgumentParser:
    """Arguments of one rank."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("mode", choices=["rank"])
    ap.add_argument("--scenario", choices=SCENARIOS, default="none")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--fault-at", type=int, default=20)
    ap.add_argument("--culprit", type=int, default=2)
    ap.add_argument("--delay-s", type=float, default=0.3)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iter-sleep-s", type=float, default=0.0)
    ap.add_argument("--pg-timeout-s", type=float, default=120.0)
    ap.add_argument("--trace", action="store_true", help="mycroft install()")
    ap.add_argument(
        "--ab-block",
        type=int,
        default=0,
        help="with --trace: trace blocks of N iterations in ABBA order (traced, "
        "paused, paused, traced, ...) and print each block's seconds",
    )
    ap.add_argument("--fr-dir", default="")
    ap.add_argument("--fr-stall-s", type=float, default=3.0)
    ap.add_argument("--on-error", choices=["wait", "exit"], default="wait")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one rank."""
    return rank_main(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
