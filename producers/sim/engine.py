"""The library entry point: ``simulate(config, faults, writer)``.

Random streams are split by purpose (faults, clocks, physics), so adding a
fault to a run does not change the jitter of the healthy parts of the job.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mycroft.producers.sim.collective import Physics
from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.effects import Effects
from mycroft.producers.sim.emit import Emitter
from mycroft.producers.sim.faults import Fault, FaultSpec, resolve, truth_entry
from mycroft.producers.sim.layout import Layout, build_layout
from mycroft.producers.sim.opblock import OpBlock
from mycroft.producers.sim.schedule import Schedule
from mycroft.producers.sim.topology import topologies
from mycroft.producers.sim.watchdog import abort_times_s
from mycroft.producers.tracefile import RecordWriter

WATCHDOG_STREAM = 8
"""The teardown's random stream (7 is the MoE routing's, ``schedule.py``)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimResult:
    """What a run did, and its ground truth."""

    config: SimConfig
    faults: tuple[Fault, ...]
    offsets_s: tuple[float, ...]
    ticks: int
    records: int
    iterations: int
    drift_ppm: tuple[float, ...] = ()
    noise_events: tuple[tuple[str, int, float, float], ...] = ()
    phase_events: tuple[tuple[str, float], ...] = ()
    aborts_s: tuple[float, ...] = ()

    @property
    def trace_start_s(self) -> float:
        """Trace start, Unix seconds (reference clock)."""
        return self.config.start_ns / 1e9

    def truth(self) -> dict[str, Any]:
        """The truth file's content (``faults`` plus run metadata)."""
        cfg = self.config
        return {
            "faults": [truth_entry(f, self.trace_start_s) for f in self.faults],
            "seed": cfg.seed,
            "job_id": cfg.job_id,
            "trace_start_s": self.trace_start_s,
            "duration_s": cfg.duration_s,
            "config": {
                "ranks": cfg.ranks,
                "tp": cfg.tp,
                "pp": cfg.pp,
                "dp": cfg.dp,
                "hosts": cfg.hosts,
                "interval_ms": cfg.interval_ms,
                "gpus_per_host": cfg.hardware.gpus_per_host,
                "gpus_per_nic": cfg.hardware.gpus_per_nic,
            },
            "clock_offsets_s": list(self.offsets_s),
            "iterations": self.iterations,
        } | self._extras()

    def _extras(self) -> dict[str, Any]:
        """Opt-in behaviours' ground truth (absent under the default config)."""
        out: dict[str, Any] = {}
        if self.drift_ppm:
            out["clock_drift_ppm"] = list(self.drift_ppm)
        if self.config.order != "tp-dp-pp":
            out["order"] = self.config.order
        if self.noise_events:
            out["noise_events"] = [
                {"kind": k, "rank": r, "start_s": a, "end_s": b}
                for k, r, a, b in self.noise_events
            ]
        if self.phase_events:
            out["phase_events"] = [{"kind": k, "at_s": t} for k, t in self.phase_events]
        if self.aborts_s:
            out["watchdog_abort"] = self._aborts()
        return out

    def _aborts(self) -> dict[str, Any]:
        """The teardown's truth: timeout, ranks torn down, first and last."""
        start = self.trace_start_s
        return {
            "timeout_s": self.config.watchdog_abort_s,
            "ranks": len(self.aborts_s),
            "first_s": start + min(self.aborts_s),
            "last_s": start + max(self.aborts_s),
        }


def _watchdog(
    cfg: SimConfig, faults: tuple[Fault, ...], layout: Layout, effects: Effects
) -> tuple[float, ...]:
    """Tear the job down after a blocking fault (``--watchdog-abort``): every
    rank's process and GPU stop at its abort time, as a crashed one's do.
    Returns the abort times of the ranks it ended (reference seconds)."""
    rng = np.random.default_rng([cfg.seed, WATCHDOG_STREAM])
    abort = abort_times_s(
        faults, cfg.watchdog_abort_s, layout, rng, cfg.watchdog_spread_s
    )
    ended = abort[np.isfinite(abort) & (abort < effects.proc_dead)]
    effects.proc_dead = np.minimum(effects.proc_dead, abort)
    effects.gpu_dead = np.minimum(effects.gpu_dead, abort)
    return tuple(float(t) for t in ended)


def resolve_faults(cfg: SimConfig, specs: Sequence[FaultSpec]) -> tuple[Fault, ...]:
    """Resolve specs against ``cfg`` with the run's fault random stream."""
    rng = np.random.default_rng([cfg.seed, 1])
    return tuple(resolve(s, cfg, rng) for s in specs)


def simulate(
    cfg: SimConfig, specs: Sequence[FaultSpec], writer: RecordWriter
) -> SimResult:
    """Run the job for ``cfg.duration_s`` and write every record to ``writer``.

    Raises:
        ConfigError: the configuration or a fault spec is invalid.
    """
    cfg.validate()
    faults = resolve_faults(cfg, specs)
    layout = build_layout(cfg)
    clock_rng = np.random.default_rng([cfg.seed, 2])
    sigma = cfg.hardware.clock_offset_s
    offsets = np.clip(
        clock_rng.normal(0.0, sigma, layout.nhosts), -3 * sigma, 3 * sigma
    )
    effects = Effects(
        faults, layout, cfg.duration_s, np.random.default_rng([cfg.seed, 3])
    )
    if cfg.noise.any:
        noise_rng = np.random.default_rng([cfg.seed, 6])
        effects.add_noise(cfg.noise, layout, cfg.duration_s, noise_rng)
    aborts = _watchdog(cfg, faults, layout, effects) if cfg.watchdog_abort_s else ()
    drift = None
    if cfg.hardware.clock_drift_ppm > 0:
        drift_rng = np.random.default_rng([cfg.seed, 5])
        ppm = cfg.hardware.clock_drift_ppm
        drift = 1e-6 * np.clip(
            drift_rng.normal(0.0, ppm, layout.nhosts), -3 * ppm, 3 * ppm
        )
    phys_rng = np.random.default_rng([cfg.seed, 4])
    schedule = Schedule(
        cfg, layout, effects, Physics(cfg, layout, effects, phys_rng), phys_rng
    )
    for topo in topologies(cfg, layout, offsets):
        writer.write(topo, cfg.start_ns)
    emitter = Emitter(
        cfg,
        layout,
        offsets,
        schedule.started,
        writer,
        proc_dead_s=effects.proc_dead,
        port_state=effects.port_state,
        drift=drift,
    )
    blocks: list[OpBlock] = []
    end_s = cfg.duration_s + float(np.abs(offsets).max()) + cfg.interval_s
    while emitter.tick < emitter.ticks_total:
        if schedule.horizon_s < end_s:
            schedule.iteration()
        blocks = emitter.run_until(blocks + schedule.blocks, schedule.horizon_s)
        schedule.blocks = []
    log.info(
        "simulated %d iterations, %d ticks, %d records",
        schedule.iterations,
        emitter.tick,
        emitter.records,
    )
    return SimResult(
        cfg,
        faults,
        tuple(float(o) for o in offsets),
        emitter.tick,
        emitter.records + layout.nhosts,
        schedule.iterations,
        () if drift is None else tuple(float(d) * 1e6 for d in drift),
        tuple(effects.noise_events),
        tuple(schedule.phases.events),
        aborts,
    )
