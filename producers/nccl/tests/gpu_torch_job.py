"""The GPU check's job through PyTorch (``gpu_check.sh`` without an NCCL library).

    python gpu_torch_job.py --probe
    RANK=R WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=P \\
        python gpu_torch_job.py --dir DIR [--device D] [--churn C] [--iters I]
        [--no-graph]

``--probe`` prints ``key=value`` lines: ``torch_nccl_version`` (23007 = 2.30.7),
``torch_gpus``, and ``nvidia_lib_dirs`` (the pip wheels' NCCL and CUDA
runtime, which ``gpu_nccl_job.c`` can load too). Otherwise one rank of the
same op mix as ``gpu_nccl_job.c`` (its header comment lists it) runs with
``torch.distributed`` on the ``nccl`` backend, started without torchrun, and
writes ``DIR/manifest-R.json`` in the same format. Ops are counted as
``"Kind bytes"``, bytes as NCCL's profiler reports them: the per-rank input
(ReduceScatter: the per-rank output).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

MIX_BYTES = (4096, 65536, 1 << 20)
P2P_BYTES = (4096, 262144, 1 << 20)
TIMED_BYTES = (131072, 524288, 4 << 20)
GRAPH_BYTES, GRAPH_REPLAYS = 196608, 5
SPLIT_BYTES, CHURN_BYTES, TAIL_BYTES = 12288, 8192, 20480
MIX_REPS, WARMUP = 2, 5


def probe() -> int:
    """Print what this Python offers the GPU check."""
    print(f"nvidia_lib_dirs={':'.join(nvidia_lib_dirs())}")
    try:
        import torch  # noqa: PLC0415 - a probe must survive a missing torch
    except ImportError as exc:
        print(f"torch_error={exc}")
        return 0
    print(f"torch_version={torch.__version__}")
    print(f"torch_gpus={torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    try:
        print(f"torch_nccl_version={nccl_version(torch)}")
    except (AttributeError, RuntimeError) as exc:  # a build without NCCL
        print(f"torch_error=no NCCL in torch: {exc}")
    return 0


def nvidia_lib_dirs() -> list[str]:
    """The ``lib`` folders of the NVIDIA wheels that hold NCCL or the CUDA runtime."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    return sorted(
        str(lib)
        for root in roots
        for lib in root.glob("*/lib")
        if any(lib.glob("libnccl.so*")) or any(lib.glob("libcudart.so*"))
    )


def nccl_version(torch: Any) -> int:
    """PyTorch's NCCL as ncclGetVersion's code (23007 = 2.30.7); torch gives a
    tuple, older releases the code itself."""
    version = torch.cuda.nccl.version()
    if isinstance(version, tuple):
        major, minor, patch = (list(version) + [0, 0, 0])[:3]
        return int(major) * 10000 + int(minor) * 100 + int(patch)
    return int(version)


class Job:
    """One rank of the mix; counts every op it issues per communicator label."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch  # noqa: PLC0415 - imported only where a rank runs
        import torch.distributed as dist  # noqa: PLC0415

        self.torch, self.dist, self.args = torch, dist, args
        self.ops: dict[str, Counter[str]] = {"world": Counter(), "split": Counter()}
        self.p2p: Counter[str] = Counter()
        self.graph: dict[str, Any] = {}
        self.timing: dict[str, float] = {}
        self.device = torch.device("cuda", args.device)

    def tensor(self, nbytes: int) -> Any:
        """A float32 tensor of ``nbytes``."""
        return self.torch.ones(nbytes // 4, device=self.device)

    def sync(self) -> None:
        """Wait for the GPU."""
        self.torch.cuda.synchronize()

    def all_reduce(
        self, nbytes: int, group: Any = None, label: str | None = "world"
    ) -> None:
        """One AllReduce of ``nbytes``, counted under ``label``."""
        self.dist.all_reduce(self.tensor(nbytes), group=group)
        if label:
            self.ops[label][f"AllReduce {nbytes}"] += 1

    def mix(self, label: str = "world") -> None:
        """AllReduce, AllGather, ReduceScatter, Broadcast of each mix size, twice."""
        world = self.dist.get_world_size()
        for _ in range(MIX_REPS):
            for size in MIX_BYTES:
                self.all_reduce(size, label=label)
                part, whole = self.tensor(size), self.tensor(size * world)
                self.dist.all_gather_into_tensor(whole, part)
                self.dist.reduce_scatter_tensor(part, whole)
                self.dist.broadcast(self.tensor(size), src=0)
                for kind in ("AllGather", "ReduceScatter", "Broadcast"):
                    self.ops[label][f"{kind} {size}"] += 1
        self.sync()

    def send_recv(self) -> None:
        """Grouped Send/Recv with the neighbours, one pair per size."""
        rank, world = self.dist.get_rank(), self.dist.get_world_size()
        for size in P2P_BYTES:
            ops = [
                self.dist.P2POp(self.dist.isend, self.tensor(size), (rank + 1) % world),
                self.dist.P2POp(self.dist.irecv, self.tensor(size), (rank - 1) % world),
            ]
            for work in self.dist.batch_isend_irecv(ops):
                work.wait()
            self.sync()
            self.p2p[f"Send {size}"] += 1
            self.p2p[f"Recv {size}"] += 1

    def graph_replays(self) -> None:
        """One AllReduce captured in a CUDA graph, replayed: every replay is an op."""
        if self.args.no_graph:
            self.graph = {"skipped": "--no-graph"}
            return
        x = self.tensor(GRAPH_BYTES)
        self.all_reduce(GRAPH_BYTES)  # connects the channels before the capture
        self.sync()
        graph = self.torch.cuda.CUDAGraph()
        try:
            with self.torch.cuda.graph(graph):
                self.dist.all_reduce(x)
        except RuntimeError as exc:  # the same on every rank: nothing was launched
            self.graph = {"skipped": f"capture failed: {exc}".splitlines()[0]}
            print(f"gpu_torch_job: CUDA graph {self.graph['skipped']}", file=sys.stderr)
            return
        for _ in range(GRAPH_REPLAYS):
            graph.replay()
        self.sync()
        self.ops["world"][f"AllReduce {GRAPH_BYTES}"] += GRAPH_REPLAYS
        self.graph = {"replays": GRAPH_REPLAYS, "bytes": GRAPH_BYTES}

    def timed(self) -> None:
        """Mean microseconds of an AllReduce per size (the overhead comparison)."""
        for size in TIMED_BYTES:
            x = self.tensor(size)
            for _ in range(WARMUP):
                self.dist.all_reduce(x)
            self.sync()
            t0 = time.perf_counter()
            for _ in range(self.args.iters):
                self.dist.all_reduce(x)
            self.sync()
            elapsed = time.perf_counter() - t0
            self.timing[str(size)] = round(elapsed / self.args.iters * 1e6, 2)
            self.ops["world"][f"AllReduce {size}"] += WARMUP + self.args.iters

    def split_and_churn(self) -> None:
        """A second communicator's ops, then communicators made and destroyed."""
        ranks = list(range(self.dist.get_world_size()))
        split = self.dist.new_group(ranks)
        self.all_reduce(SPLIT_BYTES, split, "split")
        self.all_reduce(SPLIT_BYTES, split, "split")
        world = len(ranks)
        part, whole = self.tensor(SPLIT_BYTES), self.tensor(SPLIT_BYTES * world)
        self.dist.all_gather_into_tensor(whole, part, group=split)
        self.dist.reduce_scatter_tensor(part, whole, group=split)
        self.ops["split"].update(
            [f"AllGather {SPLIT_BYTES}", f"ReduceScatter {SPLIT_BYTES}"]
        )
        self.sync()
        for _ in range(self.args.churn):
            group = self.dist.new_group(ranks)
            self.all_reduce(CHURN_BYTES, group, None)
            self.sync()
            time.sleep(0.02)  # let the proxy retire the op's flows before the destroy
            self.dist.destroy_process_group(group)
        for _ in range(3):
            self.all_reduce(TAIL_BYTES)
        self.sync()

    def manifest(self, wall_s: float) -> dict[str, Any]:
        """What the ring checker compares the rings with."""
        return {
            "job": "torch",
            "rank": self.dist.get_rank(),
            "world": self.dist.get_world_size(),
            "pid": os.getpid(),
            "device": self.args.device,
            "nccl_version": nccl_version(self.torch),
            "torch": self.torch.__version__,
            "job_id": os.environ.get("MYCROFT_JOB_ID", ""),
            "comms": {k: dict(v) for k, v in self.ops.items()},
            "churn": {"count": self.args.churn, "ops": {f"AllReduce {CHURN_BYTES}": 1}},
            "p2p": dict(self.p2p),
            "after_churn": {f"AllReduce {TAIL_BYTES}": 3},
            "graph": self.graph,
            "timing_us": self.timing,
            "iters": self.args.iters,
            "wall_s": round(wall_s, 3),
        }

    def run(self) -> dict[str, Any]:
        """The whole mix, in the order of ``gpu_nccl_job.c``; returns the manifest."""
        t0 = time.perf_counter()
        self.torch.cuda.set_device(self.device)
        self.dist.init_process_group("nccl", device_id=self.device)
        self.mix()
        self.send_recv()
        self.graph_replays()
        self.timed()
        self.split_and_churn()
        out = self.manifest(time.perf_counter() - t0)
        self.dist.destroy_process_group()
        return out


def main(argv: list[str] | None = None) -> int:
    """Probe, or run one rank and write its manifest."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--churn", type=int, default=80)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-graph", action="store_true")
    args = ap.parse_args(argv)
    if args.probe:
        return probe()
    if args.dir is None:
        ap.error("--dir is required")
    doc = Job(args).run()
    path = args.dir / f"manifest-{doc['rank']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    print(f"gpu_torch_job rank {doc['rank']}: done; AllReduce us {doc['timing_us']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
