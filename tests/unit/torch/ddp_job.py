"""A small DistributedDataParallel job on gloo with faults, and its launcher.

Not a test module. One rank: ``python ddp_job.py --scenario S ...`` (options
and faults: ``train_job.py``). The model is a 3-layer MLP under DDP with
buckets of about one layer each, so every backward issues 3 bucket
all-reduces from DDP's C++ reducer. The fault layer sits after the first
layer: the later layers' buckets were issued when it fires, the first
layer's was not.
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
    """The MLP under DDP, one bucket per layer."""
    import torch  # noqa: PLC0415

    w = args.width
    layers = [torch.nn.Linear(w, w), fault, torch.nn.ReLU(), torch.nn.Linear(w, w)]
    layers += [torch.nn.ReLU(), torch.nn.Linear(w, w)]
    layer_mb = (w * w + w) * 4 / 2**20
    return torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers), bucket_cap_mb=layer_mb * 1.1
    )


def launch(
    args: Sequence[str], world: int, env: Mapping[str, str], log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` ranks of this script; stop them with ``torch_job.stop``."""
    return train_job.launch(Path(__file__).resolve(), args, world, env, log_dir)


if __name__ == "__main__":
    sys.exit(train_job.main(build, __doc__))
