"""Flatten simulator records into per-row tables the tests can query."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from mycroft.producers.sim.config import SimConfig, Workload
from mycroft.producers.sim.engine import SimResult, simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import (
    CompletionBatch,
    Heartbeat,
    Record,
    StateBatch,
    Topology,
)
from mycroft.schemas.vocab import OP_NAMES

T0_NS = SimConfig(tp=1, pp=1, dp=1).start_ns
SEND, RECV = 0, 1


def small_config(duration_s: float = 6.0, seed: int = 7, **kw: object) -> SimConfig:
    """64 ranks: tp 8, pp 2, dp 4 on 8 hosts (host = d + 4 * stage)."""
    wl = Workload(micro_batches=4)
    return SimConfig(
        tp=8, pp=2, dp=4, duration_s=duration_s, seed=seed, workload=wl, **kw
    )  # type: ignore[arg-type]


@dataclass
class Trace:
    """Tables of one run. Times are ns on host clocks."""

    result: SimResult
    records: list[tuple[int, Record]]
    op: dict[str, np.ndarray] = field(default_factory=dict)
    flow: dict[str, np.ndarray] = field(default_factory=dict)
    rc: dict[str, np.ndarray] = field(default_factory=dict)
    done: dict[str, np.ndarray] = field(default_factory=dict)
    done_flow: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        states = [r for _, r in self.records if isinstance(r, StateBatch)]
        comps = [r for _, r in self.records if isinstance(r, CompletionBatch)]
        self.op = _table([(s.op, s.header.agent_seq) for s in states])
        self.flow = _table([(s.flow, s.header.agent_seq) for s in states])
        self.flow["op"] = np.repeat(np.arange(len(self.op["rank"])), self.op["nflows"])
        for key in ("rank", "comm", "seq", "kind", "bytes"):
            self.flow[key] = self.op[key][self.flow["op"]]
        self.rc = _table([(s.rc, s.header.agent_seq) for s in states])
        self.done = _table([(c.op, c.header.agent_seq) for c in comps])
        self.done_flow = _table([(c.flow, c.header.agent_seq) for c in comps])
        self.done_flow["op"] = np.repeat(
            np.arange(len(self.done["rank"])), self.done["nflows"]
        )
        for key in ("rank", "comm", "seq", "kind"):
            self.done_flow[key] = self.done[key][self.done_flow["op"]]

    @property
    def onset_ns(self) -> int:
        """Onset of the first fault, ns on the reference clock."""
        return T0_NS + round(self.result.faults[0].at_s * 1e9)

    def at_s(self, tick: np.ndarray) -> np.ndarray:
        """Seconds since start of tick numbers."""
        return tick * self.result.config.interval_s

    def of_kind(self, table: dict[str, np.ndarray], *names: str) -> np.ndarray:
        """Mask of rows whose op kind is one of ``names``."""
        codes = [OP_NAMES.index(n) for n in names]
        return np.isin(table["kind"], codes)

    def net(self, table: dict[str, np.ndarray]) -> np.ndarray:
        """Mask of flow rows whose peer is on another host."""
        gph = self.result.config.hardware.gpus_per_host
        return table["rank"] // gph != table["peer"] // gph

    def topologies(self) -> list[Topology]:
        """Topology records."""
        return [r for _, r in self.records if isinstance(r, Topology)]

    def heartbeats(self) -> list[Heartbeat]:
        """Heartbeat records."""
        return [r for _, r in self.records if isinstance(r, Heartbeat)]


def _table(parts: Sequence[tuple[np.ndarray, int]]) -> dict[str, np.ndarray]:
    arrays = [a for a, _ in parts]
    rows = np.concatenate(arrays)
    out = {name: rows[name] for name in rows.dtype.names or ()}
    out["tick"] = np.concatenate([np.full(len(a), t) for a, t in parts])
    return out


def run(cfg: SimConfig, *specs: str) -> Trace:
    """Simulate ``cfg`` with fault specs into memory."""
    writer = ListWriter()
    result = simulate(cfg, [parse_spec(s) for s in specs], writer)
    return Trace(result, writer.records)


@cache
def cached(*specs: str, duration_s: float = 6.0, seed: int = 7) -> Trace:
    """A run of :func:`small_config`, shared between tests."""
    return run(small_config(duration_s, seed), *specs)


def stuck_flows(trace: Trace, window_ticks: int) -> np.ndarray:
    """Mask of flow rows in the last tick that started and did not move for
    ``window_ticks`` ticks (same counters, ``last_ns`` that old)."""
    fl = trace.flow
    last_tick = fl["tick"].max()
    interval_ns = trace.result.config.interval_ms * 1_000_000
    tick_ns = T0_NS + last_tick * interval_ns
    started = fl["gpu_ready"] > 0
    old = tick_ns - fl["last_ns"] > window_ticks * interval_ns
    return (fl["tick"] == last_tick) & started & old & (fl["done"] < fl["total"])
