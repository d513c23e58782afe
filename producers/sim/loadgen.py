"""A load generator for pipeline throughput tests: many ranks, little CPU.

It simulates a small template job once (default 64 ranks = 8 hosts), keeps
its per-host StateBatch/CompletionBatch streams, and replays them as many
replicas of that job side by side: replica ``i`` shifts ranks and peers by
``i * template_ranks``, salts communicator hashes, and advances time, op
sequence numbers and ``last_ns`` as the template loops. Counters are the
template's (realistic, monotone within an op); nothing is re-simulated, so a
16,384-rank stream costs a copy and a few adds per array.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from mycroft.producers.sim.config import SimConfig, Workload
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.layout import host_name
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import BatchHeader, CompletionBatch, Record, StateBatch

TIME_FIELDS = {
    "rc": ("seen_ns",),
    "op": ("issue_ns", "start_ns", "end_ns"),
    "flow": ("last_ns", "first_ns"),
}


@dataclass(frozen=True)
class LoadConfig:
    """Size of the generated load."""

    ranks: int = 16_384
    template: SimConfig = dataclasses.field(
        default_factory=lambda: SimConfig(
            tp=8, pp=2, dp=4, duration_s=4.0, workload=Workload(micro_batches=4)
        )
    )
    job_id: str = "load"


class LoadGen:
    """Yield per-host batches of a ``ranks``-rank job, tick after tick."""

    def __init__(self, cfg: LoadConfig) -> None:
        self.cfg = cfg
        tpl = cfg.template
        writer = ListWriter()
        simulate(tpl, [], writer)
        self.period_ticks = round(tpl.duration_s * 1000) // tpl.interval_ms
        self.tpl_hosts = tpl.hosts
        self.tpl_ranks = tpl.ranks
        self.replicas = max(1, cfg.ranks // tpl.ranks)
        self.frames: dict[tuple[int, int], list[StateBatch | CompletionBatch]] = {}
        for _, rec in writer.records:
            if isinstance(rec, StateBatch | CompletionBatch):
                host = int(rec.header.host.removeprefix("node"))
                self.frames.setdefault((rec.header.agent_seq, host), []).append(rec)
        self.seq_span = 1 + max(
            int(r.rc["issued_seq"].max())
            for recs in self.frames.values()
            for r in recs
            if isinstance(r, StateBatch) and len(r.rc)
        )
        self.salts = np.arange(self.replicas, dtype=np.uint64) * np.uint64(
            0x9E3779B97F4A7C15
        )

    @property
    def hosts(self) -> int:
        """Hosts of the generated job."""
        return self.replicas * self.tpl_hosts

    def tick(self, k: int) -> Iterator[StateBatch | CompletionBatch]:
        """All batches of tick ``k`` (1-based), host by host."""
        tpl = self.cfg.template
        loop, phase = divmod(k - 1, self.period_ticks)
        shift_ns = loop * self.period_ticks * tpl.interval_ms * 1_000_000
        for rep in range(self.replicas):
            for h in range(self.tpl_hosts):
                for rec in self.frames.get((phase + 1, h), []):
                    yield self._shift(rec, rep, h, (k, shift_ns, loop * self.seq_span))

    def _shift(
        self,
        rec: StateBatch | CompletionBatch,
        rep: int,
        h: int,
        at: tuple[int, int, int],
    ) -> StateBatch | CompletionBatch:
        k, shift_ns, seq_add = at
        hdr = rec.header
        header = BatchHeader(
            self.cfg.job_id,
            host_name(rep * self.tpl_hosts + h),
            hdr.agent_epoch,
            k,
            hdr.tick_ns + shift_ns,
            hdr.interval_ms,
        )
        sh = _Shift(rep * self.tpl_ranks, self.salts[rep], shift_ns, seq_add)
        flows = _Shift(sh.offset, sh.salt, shift_ns, 0)
        if isinstance(rec, StateBatch):
            rc = _moved(rec.rc, "rc", sh)
            op = _moved(rec.op, "op", sh)
            return StateBatch(header, rc, op, _moved(rec.flow, "flow", flows))
        op = _moved(rec.op, "op", sh)
        return CompletionBatch(header, op, _moved(rec.flow, "flow", flows))

    def run(self, ticks: int, sink: Callable[[Record], None]) -> int:
        """Feed ``ticks`` ticks of batches to ``sink``; return the record count."""
        n = 0
        for k in range(1, ticks + 1):
            for rec in self.tick(k):
                sink(rec)
                n += 1
        return n


@dataclass(frozen=True)
class _Shift:
    offset: int
    salt: np.uint64
    shift_ns: int
    seq_add: int


def _moved(rows: np.ndarray, group: str, sh: _Shift) -> np.ndarray:
    out = rows.copy()
    names = rows.dtype.names or ()
    for name in ("rank", "peer"):
        if name in names:
            out[name] += sh.offset
    if "comm" in names:
        out["comm"] ^= sh.salt
    for name in ("issued_seq", "done_seq", "seq"):
        if name in names and sh.seq_add:
            out[name] += sh.seq_add
    for name in TIME_FIELDS[group]:
        if name in names and sh.shift_ns:
            out[name] = np.where(out[name] > 0, out[name] + sh.shift_ns, 0)
    return out
