"""Shared by the torch tests: the real gloo job of ``bench/torch_job.py``.

Not a test module. ``job`` loads the bench script (bench/ is no package),
``run_ranks`` starts 4 traced ranks through the ``MYCROFT_TORCH_TRACE=1``
sitecustomize hook and always stops exactly the processes it started.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from mycroft.producers.torch.run import HOOK_DIR

ROOT = Path(__file__).resolve().parents[3]
JOB_SCRIPT = ROOT / "bench" / "torch_job.py"

SCENARIO_ARGS: dict[str, list[str]] = {
    # scenario: job arguments; the culprit is named in EXPECTED
    "stall": ["--scenario", "stall", "--culprit", "2", "--iters", "200"],
    "straggler": [
        "--scenario",
        "straggler",
        "--culprit",
        "2",
        "--iters",
        "34",
        "--delay-s",
        "0.4",
    ],
    "crash": ["--scenario", "crash", "--culprit", "3", "--iters", "200"],
    "mismatch": ["--scenario", "mismatch", "--culprit", "1", "--iters", "200"],
    "order": ["--scenario", "order", "--culprit", "3", "--iters", "200"],
}
EXPECTED: dict[str, tuple[int, str, str]] = {
    # scenario: (culprit rank, component, fault kind)
    "stall": (2, "host", "hang"),
    "straggler": (2, "gpu", "slowdown"),
    "crash": (3, "process", "hang"),
    "mismatch": (1, "config", "mismatch"),
    "order": (3, "host", "hang"),
}
FR_EXPECTED: dict[str, tuple[int, str, str]] = EXPECTED | {
    # The straggler sleeps on its CPU before each all-reduce: the dumps'
    # issue times show it issues late (host). The order fault issues the two
    # groups' all-reduces in another order on rank 3: a cycle of waits
    # (config). The live tracer has no issue/start split nor wait chains yet.
    "straggler": (2, "host", "slowdown"),
    "order": (3, "config", "hang"),
}
COMMON = ["--fault-at", "20", "--width", "128", "--batch", "32"]


def job() -> ModuleType:
    """The ``bench/torch_job.py`` module."""
    spec = importlib.util.spec_from_file_location("torch_job", JOB_SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def traced_env(ring_dir: Path) -> dict[str, str]:
    """Environment of a rank traced through the opt-in hook."""
    path = os.pathsep.join(
        p for p in (str(HOOK_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    return dict(
        os.environ,
        PYTHONPATH=path,
        MYCROFT_TORCH_TRACE="1",
        MYCROFT_RING_DIR=str(ring_dir),
        MYCROFT_TORCH_KEEP_RING="1",
    )


@contextlib.contextmanager
def run_ranks(
    args: Sequence[str], env: dict[str, str], log_dir: Path, world: int = 4
) -> Iterator[list[object]]:
    """Start ``world`` ranks; SIGTERM/SIGKILL exactly them on the way out."""
    log_dir.mkdir(parents=True, exist_ok=True)
    tj = job()
    procs = tj.launch([*COMMON, *args], world, env, log_dir)
    try:
        yield procs
    finally:
        tj.stop(procs)


def logs(log_dir: Path) -> str:
    """Every rank's log, for assertion messages."""
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
        for p in sorted(log_dir.glob("rank*.log"))
    )


DUMPS_EXPECTED = {"stall": 4, "straggler": 4, "crash": 3, "mismatch": 3, "order": 4}
"""Ranks that leave a Flight Recorder dump per scenario (crash: rank 3 died;
mismatch: gloo aborts rank 0 before any Python hook runs)."""


def generate_dumps(scenario: str, out: Path, timeout_s: float = 60.0) -> Path:
    """Run ``scenario`` untraced with the FR watchdog; return the pickle folder.

    Waits until the expected ranks dumped after their stall or error (or, for
    the straggler, at the end) and stops every rank it started.
    """
    import time  # noqa: PLC0415

    want = DUMPS_EXPECTED[scenario]
    args = [*SCENARIO_ARGS[scenario], "--fr-dir", str(out)]
    # torch 2.8 records nothing unless the ring size is set (2.13: 2000).
    env = {"TORCH_FR_BUFFER_SIZE": "2000"} | dict(os.environ)
    with run_ranks(args, env, out / "logs") as procs:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            have = list((out / "pickle").glob("rank_*"))
            ended = all(p.poll() is not None for p in procs)  # type: ignore[attr-defined]
            if len(have) >= want and (ended or scenario != "straggler"):
                time.sleep(0.3)  # let the JSON twin land
                break
            time.sleep(0.2)
    return out / "pickle"
