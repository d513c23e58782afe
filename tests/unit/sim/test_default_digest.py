"""The default configuration reproduces the reference traces byte for byte.

Every behaviour beyond the default (1F1B, clock drift, noise, run-ahead) is
opt-in; these digests were taken before any of them existed, so a change
here means the default trace changed and the campaigns' numbers with it.
Last taken when the state record gained the optional ``flow_ready_wait_us``
column (StateBatch.2: a new writer schema fingerprint, and an optional
column that is zero on every row is now sent empty, CompletionBatch's
``wire_ns`` included); every decoded row, counter and time of the trace is
what it was before (checked on both traces by decoding them).
"""

from __future__ import annotations

import hashlib

from mycroft.kafka_client import record_key
from mycroft.producers.sim.config import SimConfig, Workload
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.schemas.codec import Codec

DIGESTS = {
    "healthy": "741534efc10e57385c975282e60617e3d5a6024cf3b00bb2213ea36ba7281294",
    "link-flap": "8cefefc9528448e07e73786d8c57bc2153a3fd4e57da12411e65f54f3dcc9d83",
}


class _Digest:
    def __init__(self) -> None:
        self.codec = Codec()
        self.h = hashlib.sha256()

    def write(self, record: object, ts_ns: int) -> None:
        _, key = record_key(record)  # type: ignore[arg-type]
        self.h.update(ts_ns.to_bytes(8, "little", signed=True) + key.encode())
        self.h.update(self.codec.encode(record))  # type: ignore[arg-type]


def digest(fault: str) -> str:
    """sha256 of every record of a 3 s, 64-rank default run."""
    cfg = SimConfig(
        tp=8, pp=2, dp=4, duration_s=3.0, seed=5, workload=Workload(micro_batches=4)
    )
    out = _Digest()
    specs = [parse_spec(f"{fault}:at=1")] if fault != "healthy" else []
    simulate(cfg, specs, out)  # type: ignore[arg-type]
    return out.h.hexdigest()


def test_default_trace_unchanged() -> None:
    for name, want in DIGESTS.items():
        assert digest(name) == want, f"default {name} trace changed"
