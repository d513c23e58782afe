"""The default configuration reproduces the reference traces byte for byte.

Every behaviour beyond the default (1F1B, clock drift, noise, run-ahead) is
opt-in; these digests were taken before any of them existed, so a change
here means the default trace changed and the campaigns' numbers with it.
Last taken when completed cross-host sends began to carry their time on the
wire (``wire_ns``, a new column of the completion record: the counters and
timing of the trace did not change).
"""

from __future__ import annotations

import hashlib

from mycroft.kafka_client import record_key
from mycroft.producers.sim.config import SimConfig, Workload
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.schemas.codec import Codec

DIGESTS = {
    "healthy": "b804ad556c3dc245311e9a2e2bf4170eb53c1c78a956997f1c57b58b7bd426d0",
    "link-flap": "bba34443da2d4bdca2f2f4e5655f59ee76f8afa8ff3930f83873d6f430475684",
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
