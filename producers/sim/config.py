"""Frozen configuration of a simulated job: shape, hardware and workload.

Units are in the names: ``_s`` seconds, ``_gbps`` gigabytes (1e9 bytes) per
second, ``_bytes`` bytes. Nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mycroft.errors import ConfigError
from mycroft.producers.sim.phases import Phases

DEFAULT_EPOCH_S = 1_767_225_600
"""Trace start of file output: 2026-01-01T00:00Z, fixed for determinism."""


COUNTER_MODELS = ("fluid", "slots", "nccl")
"""How a network send's counters move (``producers/sim/README.md``): ``fluid``
(T advances with the wire), ``slots`` (T = posted into a slot the receiver
granted, D = completed after the wire) or ``nccl`` (the timing of ``slots``
as NCCL's profiler plugin observes it: a send's G at most T + 1, its ready
data's wait as ``ready_wait_us``; ``schemas/ring.md`` §4c)."""


ALLREDUCE_ALGOS = ("ring", "tree")
"""NCCL_ALGO of all-reduce: ring, or double binary tree (``tree.py``)."""


@dataclass(frozen=True)
class Hardware:
    """Links, latencies and NCCL settings of every host (all hosts alike)."""

    gpus_per_host: int = 8
    gpus_per_nic: int = 2
    nvlink_gbps: float = 150.0
    nic_gbps: float = 50.0
    pcie_gbps: float = 48.0
    gpu_copy_gbps: float = 400.0
    nvlink_latency_s: float = 3e-6
    net_latency_s: float = 8e-6
    proxy_latency_s: float = 4e-6
    launch_latency_s: float = 10e-6
    chunk_bytes: int = 1 << 20
    buffer_chunks: int = 8
    tp_channels: int = 4
    pp_channels: int = 2
    dp_channels: int = 4
    clock_offset_s: float = 0.003
    jitter: float = 0.03
    clock_drift_ppm: float = 0.0
    runahead: float = 0.8
    runahead_ops: int = 0
    counters: str = "fluid"
    allreduce: str = "ring"

    def validate(self) -> None:
        """Raise :class:`ConfigError` when a value cannot work."""
        if self.gpus_per_host < 1 or self.gpus_per_nic < 1:
            raise ConfigError("gpus_per_host and gpus_per_nic must be >= 1")
        if self.gpus_per_host % self.gpus_per_nic:
            raise ConfigError(
                f"gpus_per_nic={self.gpus_per_nic} must divide "
                f"gpus_per_host={self.gpus_per_host}"
            )
        rates = (self.nvlink_gbps, self.nic_gbps, self.pcie_gbps, self.gpu_copy_gbps)
        if min(rates) <= 0 or self.chunk_bytes < 1:
            raise ConfigError("link rates and chunk_bytes must be positive")
        if min(self.tp_channels, self.pp_channels, self.dp_channels) < 1:
            raise ConfigError("every channel count must be >= 1")
        if not 0 <= self.jitter < 0.5:
            raise ConfigError(f"jitter={self.jitter} must be in [0, 0.5)")
        if not 0 <= self.clock_drift_ppm <= 1000:
            raise ConfigError(
                f"clock_drift_ppm={self.clock_drift_ppm} must be in [0, 1000]"
            )
        if self.counters not in COUNTER_MODELS:
            raise ConfigError(
                f"counters={self.counters!r} is not one of {', '.join(COUNTER_MODELS)}"
            )
        if self.allreduce not in ALLREDUCE_ALGOS:
            raise ConfigError(
                f"allreduce={self.allreduce!r} is not one of "
                f"{', '.join(ALLREDUCE_ALGOS)}"
            )
        if not 0 <= self.runahead <= 1:
            raise ConfigError(f"runahead={self.runahead} must be in [0, 1]")
        if not 0 <= self.runahead_ops <= 16:
            raise ConfigError(f"runahead_ops={self.runahead_ops} must be in [0, 16]")


SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
"""Pipeline schedules: GPipe (all forwards, then all backwards), 1F1B, and
Megatron's interleaved 1F1B over ``virtual_stages`` model chunks per stage."""


@dataclass(frozen=True)
class Noise:
    """Benign disturbances of a healthy job (all off by default).

    Rates are per simulated minute over the whole job; each event hits one
    random rank: a GC pause stops its CPU issuing ops, a proxy hiccup stops
    its send proxy, a wire burst halves its NIC's rate (cross traffic).
    """

    gc_pauses_per_min: float = 0.0
    gc_pause_s: tuple[float, float] = (0.05, 0.2)
    proxy_hiccups_per_min: float = 0.0
    proxy_hiccup_s: tuple[float, float] = (0.005, 0.04)
    wire_bursts_per_min: float = 0.0
    wire_burst_s: tuple[float, float] = (0.01, 0.05)
    storage_nics: int = 0
    port_counters_base: int = 0

    def validate(self) -> None:
        """Raise :class:`ConfigError` when a value cannot work."""
        rates = (
            self.gc_pauses_per_min,
            self.proxy_hiccups_per_min,
            self.wire_bursts_per_min,
        )
        if min(rates) < 0:
            raise ConfigError("noise rates must be >= 0 per minute")
        for lo, hi in (self.gc_pause_s, self.proxy_hiccup_s, self.wire_burst_s):
            if not 0 < lo <= hi:
                raise ConfigError("noise durations need 0 < low <= high seconds")
        if not 0 <= self.storage_nics <= 4 or not 0 <= self.port_counters_base < 255:
            raise ConfigError("storage_nics must be 0..4, port_counters_base 0..254")

    @property
    def any(self) -> bool:
        """Whether any noise is switched on."""
        return self != Noise()


@dataclass(frozen=True)
class Workload:
    """One training iteration: micro-batches (GPipe or 1F1B), then the DP step."""

    micro_batches: int = 8
    fwd_compute_s: float = 0.020
    bwd_compute_s: float = 0.040
    optimizer_s: float = 0.015
    tp_allreduces: int = 2
    tp_bytes: int = 8 << 20
    pp_bytes: int = 32 << 20
    dp_bytes: int = 1 << 30
    straggler_prob: float = 0.003
    straggler_slowdown: float = 0.3
    schedule: str = "gpipe"
    dp_allreduce: bool = False
    virtual_stages: int = 1
    # MoE (expert parallel over the TP group; moe_bytes 0 = off): after each
    # TP all-reduce, a dispatch and a combine all-to-all whose per-rank sizes
    # follow the tokens each expert got, drawn anew every call. Real MoE jobs
    # (Mixtral, DeepSeek-MoE under Megatron's all-to-all dispatcher) send
    # uneven splits every step; a detector must not read them as a mismatch.
    # moe_imbalance is the log-normal sigma of an expert's share of tokens.
    moe_bytes: int = 0
    moe_imbalance: float = 0.5

    def validate(self) -> None:
        """Raise :class:`ConfigError` when a value cannot work."""
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}"
            )
        if (self.schedule == "interleaved-1f1b") != (self.virtual_stages > 1):
            raise ConfigError(
                "virtual_stages > 1 goes with schedule='interleaved-1f1b' "
                f"(got {self.virtual_stages} with {self.schedule!r})"
            )
        if self.micro_batches < 1 or self.tp_allreduces < 1:
            raise ConfigError("micro_batches and tp_allreduces must be >= 1")
        times = (self.fwd_compute_s, self.bwd_compute_s, self.optimizer_s)
        if min(times) <= 0:
            raise ConfigError("compute times must be positive")
        if min(self.tp_bytes, self.pp_bytes, self.dp_bytes) < 1:
            raise ConfigError("message sizes must be >= 1 byte")
        if self.moe_bytes < 0 or not 0 <= self.moe_imbalance <= 2:
            raise ConfigError(
                "--moe-bytes must be >= 0 (0: no MoE) and moe_imbalance 0..2 "
                f"(got {self.moe_bytes}, {self.moe_imbalance})"
            )


ORDERS = ("tp-dp-pp", "tp-pp-dp")
"""Rank orders, innermost first: Megatron's default ``tp-dp-pp`` puts a
pipeline's stages on different hosts; ``tp-pp-dp`` puts a whole pipeline
inside a host when ``tp * pp`` GPUs fit (its transfers go over NVLink)."""


@dataclass(frozen=True)
class SimConfig:
    """A simulated job. Ranks are ``tp * pp * dp``; TP lives inside a host."""

    tp: int
    pp: int
    dp: int
    duration_s: float = 10.0
    interval_ms: int = 100
    seed: int = 0
    job_id: str = "sim"
    start_ns: int = DEFAULT_EPOCH_S * 1_000_000_000
    hardware: Hardware = field(default_factory=Hardware)
    workload: Workload = field(default_factory=Workload)
    noise: Noise = field(default_factory=Noise)
    order: str = "tp-dp-pp"
    phases: Phases = field(default_factory=Phases)
    # NCCL's watchdog / torchrun teardown after a blocking fault (watchdog.py);
    # 0 = off, the job stays blocked to the end of the trace.
    watchdog_abort_s: float = 0.0
    # How far apart the hosts' teardowns fall (uniform per host), seconds.
    watchdog_spread_s: float = 1.0

    @property
    def ranks(self) -> int:
        """World size."""
        return self.tp * self.pp * self.dp

    @property
    def hosts(self) -> int:
        """Number of hosts (the last one may be partly used)."""
        gph = self.hardware.gpus_per_host
        return (self.ranks + gph - 1) // gph

    @property
    def interval_s(self) -> float:
        """Sampling interval in seconds."""
        return self.interval_ms / 1000.0

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the flag to change."""
        self.hardware.validate()
        self.workload.validate()
        self.noise.validate()
        self.phases.validate()
        if min(self.tp, self.pp, self.dp) < 1:
            raise ConfigError("--tp, --pp and --dp must all be >= 1")
        wl = self.workload
        if wl.virtual_stages > 1 and (self.pp < 2 or wl.micro_batches % self.pp):
            raise ConfigError(
                "interleaved 1F1B needs --pp >= 2 and micro_batches a multiple "
                f"of pp (pp={self.pp}, micro_batches={wl.micro_batches})"
            )
        if self.order not in ORDERS:
            raise ConfigError(f"order={self.order!r} is not one of {', '.join(ORDERS)}")
        gph = self.hardware.gpus_per_host
        if self.tp > gph or gph % self.tp:
            raise ConfigError(
                f"--tp {self.tp} must divide the {gph} GPUs of a host "
                "(tensor parallelism stays inside a host)"
            )
        if self.ranks > gph and self.ranks % gph:
            raise ConfigError(
                f"tp*pp*dp = {self.ranks} must be a multiple of {gph} GPUs per host"
            )
        if self.duration_s <= 0:
            raise ConfigError("--duration must be positive")
        if not 10 <= self.interval_ms <= 10_000:
            raise ConfigError("--interval-ms must be between 10 and 10000")
        if self.watchdog_abort_s < 0 or self.watchdog_spread_s < 0:
            raise ConfigError(
                "--watchdog-abort (0: off) and --watchdog-spread must be >= 0 "
                f"seconds, got {self.watchdog_abort_s} and {self.watchdog_spread_s}"
            )


def from_ranks(ranks: int, tp: int, pp: int, dp: int) -> tuple[int, int, int]:
    """Check ``ranks == tp * pp * dp``; return ``(tp, pp, dp)``.

    Raises:
        ConfigError: the product does not match; the message says what to change.
    """
    if ranks != tp * pp * dp:
        raise ConfigError(
            f"--ranks {ranks} must equal --tp x --pp x --dp = "
            f"{tp} x {pp} x {dp} = {tp * pp * dp}; change one of them"
        )
    return tp, pp, dp
