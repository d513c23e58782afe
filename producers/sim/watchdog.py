"""The job's own teardown after a fault that blocks it (``--watchdog-abort S``).

In a real job a fault that blocks a collective (a NIC that goes down, a
process that crashes, a GPU that hangs) does not leave the other ranks
waiting for ever: NCCL's watchdog in every process aborts the communicator
once an op has waited ``TORCH_NCCL_*`` / ``timeout=`` seconds (600 s by
default), and torchrun's agent on each host then kills the workers it has
left. So every rank of the job goes, not only the fault's communicators:
in a blocked job each rank ends up waiting on a collective within a step,
and torchrun tears the whole job down as soon as one worker exits.

Model: a fault of kind ``hang`` that lasts at least ``S`` seconds aborts
every rank still alive at ``at + S + u``, ``u`` drawn per host uniformly in
``[0, spread)`` (``--watchdog-spread``, 1 s by default: the watchdogs of the
hosts start their timers at different op starts and the hosts' agents learn
of the failure at different times; torchrun's monitor polls every 5 s in
older versions, so seconds apart are real). An aborted process dies as a
crashed one does (``schemas/README.md`` "A process that died"): its rc rows
keep ``seen_ns`` frozen at the abort, its op and flow rows go, its
Heartbeat entry keeps ``last_write_ns`` frozen. NCCL's watchdog ends the
process with ``abort()`` and torchrun with a signal, so no exit handler
removes the ring: it freezes rather than vanishes.
"""

from __future__ import annotations

import numpy as np

from mycroft.producers.sim.faults import Fault
from mycroft.producers.sim.layout import Layout


def blocking_start_s(faults: tuple[Fault, ...], timeout_s: float) -> float:
    """Reference time of the first fault that blocks the job for at least
    ``timeout_s`` seconds (a ``hang``); ``inf`` when none does."""
    starts = [
        f.at_s for f in faults if f.info.kind == "hang" and f.duration_s >= timeout_s
    ]
    return min(starts, default=float("inf"))


def abort_times_s(
    faults: tuple[Fault, ...],
    timeout_s: float,
    layout: Layout,
    rng: np.random.Generator,
    spread_s: float = 1.0,
) -> np.ndarray:
    """When each rank's process is torn down, reference seconds (``inf``:
    never, also for every rank when ``timeout_s`` is 0, the default)."""
    out = np.full(layout.nranks, np.inf)
    start = blocking_start_s(faults, timeout_s) if timeout_s > 0 else np.inf
    if np.isinf(start):
        return out
    spread = rng.uniform(0.0, spread_s, layout.nhosts)
    out[:] = start + timeout_s + spread[layout.host_of]
    return out
