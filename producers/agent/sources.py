"""What the agent reads: ring buffers in a folder, a recorded trace file, the simulator.

Ring and replay sources resume from a checkpoint (``dict``) that the agent
stores in its spool with every tick, so a restarted agent continues where the
records it already spooled end.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mycroft.errors import ConfigError
from mycroft.producers.agent.aggregate import Aggregator
from mycroft.producers.ring import RingReader
from mycroft.producers.ring_layout import Beat, RingHeader
from mycroft.producers.sim.cli import build_parser, config_from
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import Frame, TraceFileWriter, read_frames
from mycroft.schemas.records import RankHealth, Record

log = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


COVERAGE = (
    "dropped_comms",
    "dropped_ops",
    "dropped_flows",
    "unseen_ops",
    "abandoned_ops",
    "orphan_flows",
)
"""The writers' BEAT counters of what they lost or could not see."""

Route = Aggregator | Callable[[RingHeader], Aggregator]
"""Where a ring's records go: one aggregator, or one chosen per ring from its
header (the agent keeps one per training job: the header's ``job_id``)."""


class RingSource:
    """Every ring file matching ``glob`` under ``directory``, discovered each scan.

    Args:
        directory: the shared-memory folder the training processes write in.
        glob: file pattern of ring files.
        checkpoint: ``{ring identity: next record index}`` from the last run.
    """

    def __init__(
        self,
        directory: Path | str,
        glob: str = "*.ring",
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        self.dir, self.glob = Path(directory), glob
        self.readers: dict[str, RingReader] = {}
        self._resume: dict[str, int] = {
            k: int(v) for k, v in (checkpoint or {}).get("rings", {}).items()
        }
        self._bad: set[str] = set()
        self._agg: dict[str, Aggregator] = {}  # ring identity -> its job's
        self.beats: dict[str, Beat] = {}  # ring identity -> its newest BEAT
        self.gone_overwritten = self.gone_corrupt = 0
        self._gone_coverage = dict.fromkeys(COVERAGE, 0)

    def scan(self, route: Route) -> None:
        """Open new rings, close rings whose file was removed or replaced."""
        seen: set[str] = set()
        for path in sorted(self.dir.glob(self.glob)):
            if str(path) in self._bad:
                continue
            try:
                reader = RingReader(path, flow_steps=True)
            except (OSError, ValueError) as exc:
                log.warning("ignoring %s: %s", path, exc)
                self._bad.add(str(path))
                continue
            seen.add(reader.identity)
            if reader.identity in self.readers:
                reader.close()
                continue
            agg = route if isinstance(route, Aggregator) else route(reader.header)
            self._open(reader, agg)
        for ident in [i for i in self.readers if i not in seen]:
            self._drop(ident)

    def _open(self, reader: RingReader, agg: Aggregator) -> None:
        ident, h = reader.identity, reader.header
        self._agg[ident] = agg
        agg.add_rank(ident, h.rank, h.pid, h.local_rank)
        reader.seek(reader.oldest_index())
        resume = self._resume.pop(ident, None)
        if resume is not None and resume > reader.next_index:
            # Rebuild in-flight state from records already shipped, without re-emitting.
            for rec in reader.poll(resume - reader.next_index):
                agg.apply(ident, rec, emit=False)
        log.info(
            "reading ring %s (rank %d, pid %d) from record %d",
            reader.path,
            h.rank,
            h.pid,
            reader.next_index,
        )
        self.readers[ident] = reader

    def _drop(self, ident: str) -> None:
        reader = self.readers.pop(ident)
        self.gone_overwritten += reader.overwritten
        self.gone_corrupt += reader.corrupt
        beat = self.beats.pop(ident, None)
        if beat is not None:
            for k in COVERAGE:
                self._gone_coverage[k] += int(getattr(beat, k))
        reader.close()
        self._agg.pop(ident).remove_rank(ident)

    def drain(self) -> int:
        """Fold everything new from every ring into its aggregator; return
        records read."""
        n = 0
        for ident, reader in self.readers.items():
            agg = self._agg[ident]
            for rec in reader.poll():
                agg.apply(ident, rec)
                if isinstance(rec, Beat):
                    self.beats[ident] = rec
                n += 1
        return n

    def checkpoint(self) -> dict[str, Any]:
        """Where each ring's reading stands (stored with every spooled tick)."""
        return {"rings": {i: r.next_index for i, r in self.readers.items()}}

    def health(self, agg: Aggregator | None = None) -> tuple[RankHealth, ...]:
        """Per process loss counters for the heartbeat (of ``agg``'s rings only,
        when given): the agent's own and what the writer's BEAT counted."""
        out = []
        for ident, r in sorted(self.readers.items(), key=lambda kv: kv[1].header.rank):
            if agg is not None and self._agg.get(ident) is not agg:
                continue
            b = self.beats.get(ident) or Beat(0, -1)
            out.append(
                RankHealth(
                    r.header.rank,
                    r.header.pid,
                    r.last_write_ns,
                    r.overwritten,
                    r.corrupt,
                    b.dropped_comms,
                    b.dropped_ops,
                    b.dropped_flows,
                    b.unseen_ops,
                    b.abandoned_ops,
                    b.orphan_flows,
                )
            )
        return tuple(out)

    def coverage(self) -> dict[str, int]:
        """The writers' BEAT counters summed over every ring ever read (agent
        lifetime; a ring that went keeps its last counts)."""
        return {
            k: self._gone_coverage[k]
            + sum(int(getattr(b, k)) for b in self.beats.values())
            for k in COVERAGE
        }

    def overwritten(self) -> int:
        """Ring overwrites of every ring ever read (agent lifetime)."""
        return int(
            self.gone_overwritten + sum(r.overwritten for r in self.readers.values())
        )

    def corrupt(self) -> int:
        """Corrupt ring slots of every ring ever read (agent lifetime)."""
        return int(self.gone_corrupt + sum(r.corrupt for r in self.readers.values()))

    def lag_records(self) -> int:
        """Records committed to rings and not read yet."""
        return sum(r.lag() for r in self.readers.values())

    def alive(self) -> int:
        """How many ring writers are still running."""
        return sum(_pid_alive(r.header.pid) for r in self.readers.values())

    def close(self) -> None:
        """Unmap every ring."""
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()


class ReplaySource:
    """Frames of a recorded trace file, paced by trace time (``speed`` 0: at once).

    Args:
        path: the trace file (``mycroft.producers.tracefile`` format).
        speed: 1.0 replays in real time, 2.0 twice as fast, 0 as fast as possible.
        checkpoint: ``{"replay": {"file": path, "frames": n}}`` from the last run.
    """

    def __init__(
        self,
        path: Path | str,
        speed: float = 0.0,
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        self.path, self.speed = Path(path), speed
        if not self.path.exists():
            raise ConfigError(f"replay file {self.path} does not exist")
        prev = (checkpoint or {}).get("replay", {})
        self.done = (
            int(prev.get("frames", 0)) if prev.get("file") == str(self.path) else 0
        )
        self._frames = read_frames(self.path)
        for _ in range(self.done):
            next(self._frames, None)
        self._pending: Frame | None = None
        self._t0_trace: int | None = None
        self.finished = False
        self.trace_ns = 0  # trace time of the newest frame taken (0: none yet)

    def take(self, elapsed_s: float, limit: int = 10_000) -> list[Frame]:
        """Frames due ``elapsed_s`` after the start (at most ``limit``)."""
        out: list[Frame] = []
        while len(out) < limit:
            frame = self._pending or next(self._frames, None)
            self._pending = None
            if frame is None:
                self.finished = True
                break
            if self._t0_trace is None:
                self._t0_trace = frame.ts_ns
            if (
                self.speed > 0
                and (frame.ts_ns - self._t0_trace) / 1e9 > elapsed_s * self.speed
            ):
                self._pending = frame
                break
            out.append(frame)
        self.done += len(out)
        if out:
            self.trace_ns = max(self.trace_ns, out[-1].ts_ns)
        return out

    def checkpoint(self) -> dict[str, Any]:
        """How many frames were spooled already."""
        return {"replay": {"file": str(self.path), "frames": self.done}}

    def close(self) -> None:
        """Close the file."""
        close = getattr(self._frames, "close", None)
        if close is not None:
            close()


SIM_START_ALIGN_S = 10


class HostWriter:
    """Keep the records of one host (all hosts for ``"*"``) from a simulated job."""

    def __init__(self, inner: TraceFileWriter, host: str) -> None:
        self.inner, self.host = inner, host

    def write(self, record: Record, ts_ns: int) -> None:
        """Pass the record on when it belongs to this agent's host."""
        host = getattr(getattr(record, "header", record), "host", None)
        if self.host in ("*", host):
            self.inner.write(record, ts_ns)

    def close(self) -> None:
        """Close the trace file."""
        self.inner.close()


def simulate_host(
    sim_args: str, host: str, job_id: str, workdir: Path, start_s: float = 0.0
) -> Path:
    """Run ``mycroft simulate`` in-process, starting now; keep ``host``'s records.

    Every agent of a simulated job runs the same seeded simulation, so N agents
    (one per simulated host, ``--host node0003``) publish exactly what one
    simulation of the whole job would. ``host="*"`` publishes every host. The
    simulated job starts at ``start_s`` (Unix seconds) when given, else at the
    last whole ``SIM_START_ALIGN_S`` of wall time, so agents started within
    the same window share one trace clock; each then publishes its backlog at
    once and keeps pace with real time.

    Returns:
        A trace file of this host's records, to replay in real time.

    Raises:
        ConfigError: ``sim_args`` are invalid for ``mycroft simulate``.
    """
    trace = workdir / f"sim-{host.replace('*', 'all')}.trace"
    trace.parent.mkdir(parents=True, exist_ok=True)
    try:
        args = build_parser().parse_args(
            [*shlex.split(sim_args), "--out", str(trace), "--job-id", job_id]
        )
    except SystemExit as exc:
        raise ConfigError(f"invalid --sim-args {sim_args!r}") from exc
    align_ns = SIM_START_ALIGN_S * 1_000_000_000
    start_ns = int(start_s * 1e9) if start_s else time.time_ns() // align_ns * align_ns
    cfg = dataclasses.replace(config_from(args), start_ns=start_ns)
    writer = HostWriter(TraceFileWriter(trace), host)
    try:
        result = simulate(cfg, [parse_spec(f) for f in args.fault], writer)
    finally:
        writer.close()
    args.truth.write_text(json.dumps(result.truth(), indent=2) + "\n")
    log.info("simulated %s for host %s into %s", sim_args, host, trace)
    return trace
