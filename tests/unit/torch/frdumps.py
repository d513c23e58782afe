"""Small Flight Recorder dumps written the way torch 2.13 writes them.

Not a test module: ``entry`` is one entry dict (``version`` 2.10 fields),
``write`` one rank's pickled dump, its mtime 4 s after its newest entry.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

T0 = 1_800_000_000_000_000_000
MS = 1_000_000


def entry(seq: int, t_ms: float, name: str = "all_reduce", **kw: Any) -> dict[str, Any]:
    """One torch 2.13 Flight Recorder entry of the default group."""
    out = {
        "record_id": seq,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{name}",
        "time_created_ns": T0 + int(t_ms * MS),
        "duration_ms": None,
        "input_sizes": [[8]],
        "input_dtypes": ["Float"],
        "output_sizes": [[8]],
        "output_dtypes": ["Float"],
        "state": "completed",
        "time_discovered_started_ns": T0 + int(t_ms * MS),
        "time_discovered_completed_ns": None,
        "retired": True,
        "timeout_ms": 600_000,
        "is_p2p": False,
        "frames": [],
    }
    return out | kw


def write(
    folder: Path,
    rank: int,
    entries: list[dict[str, Any]],
    groups: dict[str, list[int]] | None = None,
) -> None:
    """One rank's dump; ``groups``: members of each group (default: 4 ranks)."""
    config = {
        pg: {
            "name": pg,
            "desc": "default_pg" if pg == "0" else f"pg{pg}",
            "ranks": str(m),
        }
        for pg, m in (groups or {"0": [0, 1, 2, 3]}).items()
    }
    doc = {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": entries}
    folder.mkdir(exist_ok=True)
    path = folder / f"rank_{rank}"
    path.write_bytes(pickle.dumps(doc))
    dumped = max((e["time_created_ns"] for e in entries), default=T0) + 4000 * MS
    os.utime(path, ns=(dumped, dumped))  # written 4 s after its newest entry


def healthy(n: int, rank: int, pg: str = "0") -> list[dict[str, Any]]:
    """``n`` retired all-reduces of group ``pg``, one each 50 ms."""
    where = {"process_group": (pg, "default_pg" if pg == "0" else f"pg{pg}")}
    return [entry(i, i * 50 + rank * 0.1, **where) for i in range(1, n + 1)]
