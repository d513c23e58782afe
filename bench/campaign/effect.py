"""Whether an injected fault cost the job anything: the iterations it lost
against its healthy twin (the same setting, seed and duration, no fault).

The simulator draws each purpose from its own random stream (clock offsets,
fault effects, noise, jitter), so the twin runs the same job step for step
and differs only by the fault. A fault that leaves the job's throughput as
it was (a NIC capped above what its flows need, latency added where credits
keep enough data in flight, a port whose flaps fall in the job's slack) is
real, but nothing in the job waits longer for it, and a detector of stalls
and slowdowns that stays silent on it is right to. Such runs are counted in
every headline number all the same; the campaigns report the accuracy over
the runs that cost the job at least one iteration beside it, so that a
reader can tell missed slowdowns from faults with no slowdown to detect.
The twin runs the simulator only (no analysis); its verdicts are not read.

``bench/campaign_effect.py`` adds the same to result files written before
the campaign measured it.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any, Protocol

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.schemas.records import Record


class _Setting(Protocol):
    @property
    def name(self) -> str: ...

    def config(self, seed: int, duration_s: float, job_id: str) -> SimConfig: ...


class _Discard:
    """A record writer that keeps nothing (the twin's records are not read)."""

    def write(self, record: Record, ts_ns: int) -> None:
        """Drop one record."""

    def close(self) -> None:
        """Nothing to release."""


def iterations(args: tuple[_Setting, int, float, str]) -> int:
    """Iterations one run completes (simulated only; fault ``""``: healthy)."""
    setting, seed, duration_s, fault = args
    cfg = setting.config(seed, duration_s, f"gen-{fault or 'healthy'}-{seed}")
    return simulate(cfg, [parse_spec(fault)] if fault else [], _Discard()).iterations


def twins(
    ex: Executor, runs: Iterable[tuple[_Setting, int, float]]
) -> dict[tuple[str, int], int]:
    """Iterations of the healthy twin of each fault run (setting, campaign
    seed, duration), simulated once each on ``ex``, keyed as :func:`mark`
    reads them: (setting name, the simulator's seed)."""
    unique = sorted(set(runs), key=lambda r: (r[0].name, r[1], r[2]))
    counts = ex.map(iterations, [(s, seed, d, "") for s, seed, d in unique])
    return {
        (s.name, s.config(seed, d, "twin").seed): n
        for (s, seed, d), n in zip(unique, counts, strict=True)
    }


def mark(rows: list[dict[str, Any]], twins: dict[tuple[str, int], int]) -> None:
    """Set each fault row's ``iterations_lost`` (its twin's iterations minus
    its own) and ``effect`` (at least one lost); ``twins``: iterations by
    (setting, seed)."""
    for row in rows:
        twin = twins.get((row["setting"], row["seed"]))
        if row["fault"] == "healthy" or twin is None:
            continue
        row["iterations_lost"] = twin - row["iterations"]
        row["effect"] = row["iterations_lost"] >= 1


def effective(faulty: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy over the fault runs that cost the job an iteration, and the
    runs that did not, by fault."""
    hit = [r for r in faulty if r.get("effect")]
    n = max(len(hit), 1)
    idle: dict[str, int] = {}
    for r in faulty:
        if r.get("effect") is False:
            idle[r["fault"]] = idle.get(r["fault"], 0) + 1
    return {
        "effective_fault_runs": len(hit),
        "culprit_accuracy_effective": round(
            sum(bool(r["rank_ok"]) for r in hit) / n, 3
        ),
        "component_accuracy_effective": round(
            sum(bool(r["component_ok"]) for r in hit) / n, 3
        ),
        "no_effect_runs": dict(sorted(idle.items())),
    }
