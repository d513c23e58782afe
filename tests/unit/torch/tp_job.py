"""A small tensor-parallel (DTensor) job on gloo with faults, and its launcher.

Not a test module. One rank: ``python tp_job.py --scenario S ...`` (options
and faults: ``train_job.py``). The model is two MLP blocks, each a
``ColwiseParallel`` Linear(w, 4w), a ReLU and a ``RowwiseParallel``
Linear(4w, w), parallelized with ``parallelize_module`` over a 1-D CPU mesh
of every rank. DTensor issues its collectives as functional collectives
(``torch.distributed._functional_collectives``), never through the
``torch.distributed`` functions: each block all-reduces its output in
forward and its input's gradient in backward, 4 all-reduces a step. The
fault layer sits between the blocks: the second block's backward all-reduce
was issued when it fires, the first block's was not.
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
    """The two blocks, column- then row-wise parallel."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    w, lin, relu = args.width, torch.nn.Linear, torch.nn.ReLU
    block = (lin(w, 4 * w), relu(), lin(4 * w, w))
    net = torch.nn.Sequential(*block, fault, lin(w, 4 * w), relu(), lin(4 * w, w))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    plan |= {"4": ColwiseParallel(), "6": RowwiseParallel()}
    return parallelize_module(net, mesh, plan)


def launch(
    args: Sequence[str], world: int, env: Mapping[str, str], log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` ranks of this script; stop them with ``torch_job.stop``."""
    return train_job.launch(Path(__file__).resolve(), args, world, env, log_dir)


if __name__ == "__main__":
    sys.exit(train_job.main(build, __doc__))
