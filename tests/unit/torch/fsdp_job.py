"""A small FSDP2 (``fully_shard``) job on gloo with faults, and its launcher.

Not a test module. One rank: ``python fsdp_job.py --scenario S ...`` (options
and faults: ``train_job.py``). The model is a 3-layer MLP, each layer its own
``fully_shard`` unit over a 1-D CPU mesh of every rank: every forward
all-gathers each layer's parameters and every backward all-gathers them
again and reduce-scatters their gradients (``all_gather_into_tensor`` and
``reduce_scatter_tensor``, which gloo's Flight Recorder shows as
all_reduce). The fault layer sits after the first layer: the later layers'
reduce-scatters were issued when it fires, the first layer's was not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.unit.torch import train_job


def build(args: argparse.Namespace, fault: Any) -> Any:
    """The MLP, each Linear and the whole fully sharded."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    w = args.width
    linears = [torch.nn.Linear(w, w) for _ in range(3)]
    net = torch.nn.Sequential(
        linears[0], fault, torch.nn.ReLU(), linears[1], torch.nn.ReLU(), linears[2]
    )
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in linears:
        fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def launch(
    args: Sequence[str], world: int, env: Mapping[str, str], log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` ranks of this script; stop them with ``torch_job.stop``."""
    return train_job.launch(Path(__file__).resolve(), args, world, env, log_dir)


if __name__ == "__main__":
    sys.exit(train_job.main(build, __doc__))
