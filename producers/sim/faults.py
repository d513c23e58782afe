"""Fault specifications: parsing ``NAME[:key=value,...]``, defaults, ground truth.

A spec names a fault of :data:`FAULTS`; every omitted key is drawn from the
seed, so the same command line always injects the same fault. The resolved
:class:`Fault` is what the effects model applies and what the truth file
records; nothing of it reaches the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mycroft.errors import ConfigError
from mycroft.producers.sim.config import SimConfig


@dataclass(frozen=True)
class FaultInfo:
    """Expected diagnosis of a fault type and the default severity range."""

    component: str
    kind: str
    severity: tuple[float, float] = (0.5, 0.5)
    scope: str = "rank"


FAULTS: dict[str, FaultInfo] = {
    "nic-down": FaultInfo("nic", "hang", scope="nic"),
    "nic-bandwidth": FaultInfo("nic", "slowdown", (0.6, 0.85), "nic"),
    "pcie-downgrade": FaultInfo("pcie", "slowdown", (0.8, 0.9)),
    "gpu-power-cap": FaultInfo("gpu", "slowdown", (0.3, 0.5)),
    "gpu-background-load": FaultInfo("gpu", "slowdown", (0.25, 0.45), "host"),
    "net-background-traffic": FaultInfo("network", "slowdown", (0.4, 0.7), "host"),
    "proxy-delay": FaultInfo("proxy", "slowdown"),
    "process-crash": FaultInfo("process", "hang"),
    "host-stall": FaultInfo("host", "hang"),
    "collective-mismatch": FaultInfo("config", "mismatch"),
    "link-flap": FaultInfo("nic", "slowdown", scope="nic"),
    "switch-congestion": FaultInfo("network", "slowdown", (0.5, 0.7), "switch"),
    "gpu-hang": FaultInfo("gpu", "hang"),
    "port-flap": FaultInfo("nic", "slowdown", (0.05, 0.15), "nic"),
}
"""Fault name -> expected component and kind (issue 3's table)."""

COMMON_KEYS = ("rank", "peer", "host", "at", "duration", "severity")
EXTRA_KEYS: dict[str, tuple[str, ...]] = {
    "link-flap": ("period", "down"),
    "port-flap": ("period", "down"),
    "proxy-delay": ("stall", "every"),
    "switch-congestion": ("count",),
    "net-background-traffic": ("count",),
}
NETWORK_FAULTS = frozenset(
    {
        "nic-down",
        "nic-bandwidth",
        "link-flap",
        "port-flap",
        "net-background-traffic",
        "switch-congestion",
        "proxy-delay",
        "pcie-downgrade",
    }
)


@dataclass(frozen=True)
class FaultSpec:
    """A fault as written on the command line: name and raw parameters."""

    name: str
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fault:
    """A fully resolved fault. Times are seconds since the simulation start."""

    name: str
    rank: int | None
    peer: int | None
    hosts: tuple[int, ...]
    ranks: tuple[int, ...]
    at_s: float
    duration_s: float
    severity: float
    extra: tuple[tuple[str, float], ...] = ()

    @property
    def info(self) -> FaultInfo:
        """Expected component and kind."""
        return FAULTS[self.name]

    @property
    def end_s(self) -> float:
        """End of the fault window (``inf``: until the end of the run)."""
        return self.at_s + self.duration_s

    def param(self, key: str) -> float:
        """A fault-specific parameter (``period``, ``stall``, ...)."""
        return dict(self.extra)[key]


def parse_spec(text: str) -> FaultSpec:
    """Parse ``NAME[:key=value,...]``.

    Raises:
        ConfigError: unknown fault, unknown key or malformed pair.
    """
    name, _, rest = text.partition(":")
    name = name.strip()
    if name not in FAULTS:
        raise ConfigError(
            f"unknown fault {name!r}; use one of: {', '.join(sorted(FAULTS))}"
        )
    params: dict[str, str] = {}
    allowed = COMMON_KEYS + EXTRA_KEYS.get(name, ())
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = pair.partition("=")
        if not eq or key not in allowed:
            raise ConfigError(
                f"bad parameter {pair!r} in --fault {text!r}; "
                f"write key=value with key one of: {', '.join(allowed)}"
            )
        params[key] = value
    return FaultSpec(name, params)


def _number(spec: FaultSpec, key: str, default: float) -> float:
    if key not in spec.params:
        return default
    try:
        value = float(spec.params[key])
    except ValueError:
        raise ConfigError(
            f"--fault {spec.name}: {key}={spec.params[key]!r} is not a number"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"--fault {spec.name}: {key} must be a finite number >= 0")
    return value


def _index(spec: FaultSpec, key: str, default: int, limit: int) -> int:
    value = _number(spec, key, default)
    if value != int(value) or not 0 <= value < limit:
        raise ConfigError(
            f"--fault {spec.name}: {key}={spec.params[key]} must be an integer "
            f"in [0, {limit})"
        )
    return int(value)


def _hosts(spec: FaultSpec, host: int, cfg: SimConfig) -> tuple[int, ...]:
    if spec.name == "switch-congestion":
        count = int(_number(spec, "count", min(4, cfg.hosts)))
        first = host // max(count, 1) * max(count, 1)
        return tuple(h for h in range(first, first + count) if h < cfg.hosts)
    if spec.name == "net-background-traffic":
        count = int(_number(spec, "count", 1))
        return tuple(sorted({(host + 2 * i) % cfg.hosts for i in range(count)}))
    return (host,)


def _ranks(
    name: str, rank: int, hosts: tuple[int, ...], cfg: SimConfig
) -> tuple[int, ...]:
    gph, gpn = cfg.hardware.gpus_per_host, cfg.hardware.gpus_per_nic
    scope = FAULTS[name].scope
    if scope == "rank":
        return (rank,)
    if scope == "nic":
        first = rank // gpn * gpn
        return tuple(r for r in range(first, first + gpn) if r < cfg.ranks)
    return tuple(
        r for h in hosts for r in range(h * gph, (h + 1) * gph) if r < cfg.ranks
    )


def _extra(spec: FaultSpec) -> tuple[tuple[str, float], ...]:
    defaults = {"period": 1.0, "down": 0.25, "stall": 1.0, "every": 3.0, "count": 0.0}
    if spec.name == "port-flap":
        # A marginal link retrains in milliseconds, about twice a second.
        defaults |= {"period": 0.5, "down": 0.003}
    keys = EXTRA_KEYS.get(spec.name, ())
    return tuple((k, _number(spec, k, defaults[k])) for k in keys)


def resolve(spec: FaultSpec, cfg: SimConfig, rng: np.random.Generator) -> Fault:
    """Fill every omitted key from ``rng`` and check ranges against ``cfg``.

    Raises:
        ConfigError: an index is out of range, ``at`` is past the run, or the
            fault needs inter-host traffic the job does not have.
    """
    info = FAULTS[spec.name]
    gph = cfg.hardware.gpus_per_host
    draw_rank = int(rng.integers(cfg.ranks))
    draw_at = float(rng.uniform(0.3, 0.5)) * cfg.duration_s
    draw_sev = float(rng.uniform(*info.severity))
    if "host" in spec.params and "rank" not in spec.params:
        host = _index(spec, "host", 0, cfg.hosts)
        rank = min(host * gph + draw_rank % gph, cfg.ranks - 1)
    else:
        rank = _index(spec, "rank", draw_rank, cfg.ranks)
        host = rank // gph
    if spec.name in NETWORK_FAULTS and cfg.hosts < 2:
        raise ConfigError(
            f"--fault {spec.name} needs traffic between hosts; use more than "
            f"{gph} ranks (at least 2 hosts)"
        )
    at_s = _number(spec, "at", draw_at)
    if at_s >= cfg.duration_s:
        raise ConfigError(
            f"--fault {spec.name}: at={at_s} is not before --duration {cfg.duration_s}"
        )
    hosts = _hosts(spec, host, cfg)
    peer = _index(spec, "peer", 0, cfg.ranks) if "peer" in spec.params else None
    severity = _number(spec, "severity", draw_sev)
    if not 0 < severity < 1:
        raise ConfigError(f"--fault {spec.name}: severity must be in (0, 1)")
    return Fault(
        name=spec.name,
        rank=rank if info.scope in ("rank", "nic") else None,
        peer=peer,
        hosts=hosts,
        ranks=_ranks(spec.name, rank, hosts, cfg),
        at_s=at_s,
        duration_s=_number(spec, "duration", math.inf) or math.inf,
        severity=severity,
        extra=_extra(spec),
    )


def truth_entry(fault: Fault, trace_start_s: float) -> dict[str, Any]:
    """One ``faults[]`` entry of the truth file."""
    info = fault.info
    return {
        "fault": fault.name,
        "kind": info.kind,
        "component": info.component,
        "rank": fault.rank,
        "peer": fault.peer,
        "hosts": list(fault.hosts),
        "ranks": list(fault.ranks),
        "onset_s": trace_start_s + fault.at_s,
        "at_s": fault.at_s,
        "duration_s": None if math.isinf(fault.duration_s) else fault.duration_s,
        "severity": fault.severity,
        "params": dict(fault.extra),
    }
