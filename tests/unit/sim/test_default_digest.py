"""The default configuration reproduces the reference traces byte for byte.

Every behaviour beyond the default (1F1B, clock drift, noise, run-ahead) is
opt-in; these digests were taken before any of them existed, so a change
here means the default trace changed and the campaigns' numbers with it.
Last taken when receive flows began to report G as the buffers the receiver
posted (``schemas/ring.md``), not the sender's transmit.
"""

from __future__ import annotations

import hashlib

from mycroft.kafka_client import record_key
from mycroft.producers.sim.config import SimConfig, Workload
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.schemas.codec import Codec

DIGESTS = {
    "healthy": "f43e3d82b752c1fa6d4f5a5f6401966e409014a1676cf82f6794046704511870",
    "link-flap": "79300053af0f2bae08b5b125da4a826b5c8dc10b75cda8de77a5cd6baf793b0e",
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
