"""GPU completion of NCCL collectives, from ProcessGroupNCCL's on-completion hook.

On NCCL a wrapped call returns once the op is enqueued on its stream, and
the Flight Recorder knows an op's end only as its watchdog discovered it.
With ``TORCH_NCCL_ENABLE_TIMING=1`` (which ``install`` sets when it is
unset and no group exists yet) torch records CUDA start and end events
around every work and, for a hook registered with
``ProcessGroup._register_on_completion_hook``, hands each completed work
(DDP's bucket all-reduces included) as a ``WorkInfo``: the op type, the
group's collective number ``seq`` (from 1, the Flight Recorder's
``collective_seq_id``), ``time_finished`` (wall clock when the watchdog saw
it complete) and ``active_duration`` (GPU time between the two events).

:class:`GpuCompletions` is that hook. It runs on torch's hook thread, copies
four numbers into a bounded deque and returns: it never touches the GPU, the
ring or a lock of the training thread, and never raises (an exception in the
hook aborts every communicator of the group). The tracer's poll thread
drains the deque on each tick, after the Flight Recorder poll: the
completion of an op already on the ring (a wrapper or the poll wrote its
OP_ISSUED) becomes its OP_DONE at ``time_finished``, started
``active_duration`` before; one whose op is not on the ring yet waits
``wait_ticks`` ticks, then counts as lost. While a group's hook is on
(``CommRef.gpu_done``), neither the wrappers nor the poll write an OP_DONE
for its collectives.

Point-to-point works are skipped: NCCL numbers them apart from collectives,
and the wrappers' pairs have numbers of their own; their wrappers' OP_DONE
stands.

Placement: the end is the watchdog's discovery, so it is late by up to the
watchdog's poll period (about 100 ms in recent torch), independently on
every rank; the GPU duration is exact. Torch-free: ``WorkInfo`` is read by
attribute.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mycroft.producers.torch.tracer import CommRef, Tracer

log = logging.getLogger(__name__)

TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
"""torch reads it when a NCCL group is made; the hook needs it set."""

P2P_OP_TYPES = frozenset({"SEND", "RECV", "RECVANYSOURCE"})
"""``OpType`` names of point-to-point works (skipped, see the module doc)."""

MAX_QUEUED = 65_536
"""Completions the hook keeps between two ticks; more are counted, dropped."""

WAIT_TICKS = 50
"""Ticks a completion waits for its op's OP_ISSUED (5 s at the default
beat): the poll writes a C++-issued op on its next read."""


@dataclass
class GpuDoneStats:
    """What the hook and the drain did."""

    seen: int = 0
    written: int = 0
    p2p: int = 0
    lost: int = 0
    """Completions whose op never reached the ring within ``wait_ticks``."""
    dropped: int = 0
    """Completions over ``MAX_QUEUED`` between two ticks."""
    errors: int = 0
    last_error: str = ""


_Done = tuple[CommRef, int, int, int]
"""(group, seq from 0, end ns, start ns) of one completed work."""


class GpuCompletions:
    """The on-completion hook of every NCCL group, and its drain."""

    def __init__(
        self, tracer: Tracer, wait_ticks: int = WAIT_TICKS, max_queued: int = MAX_QUEUED
    ) -> None:
        self.tracer = tracer
        self.wait_ticks = wait_ticks
        self.max_queued = max_queued
        self.stats = GpuDoneStats()
        self._queue: deque[_Done] = deque()
        self._waiting: list[tuple[_Done, int]] = []

    def hook_for(self, ref: CommRef) -> Callable[[Any], None]:
        """The hook of ``ref``'s group; it never raises."""

        def hook(info: Any) -> None:
            stats = self.stats
            try:
                stats.seen += 1
                if _op_name(info.op_type) in P2P_OP_TYPES:
                    stats.p2p += 1
                    return
                if len(self._queue) >= self.max_queued:
                    stats.dropped += 1
                    return
                end = epoch_ns(info.time_finished)
                start = end - max(0, duration_ns(info.active_duration))
                self._queue.append((ref, int(info.seq) - 1, end, start))
            except Exception as exc:  # noqa: BLE001 - an escape aborts the group
                stats.errors += 1
                stats.last_error = f"{type(exc).__name__}: {exc}"

        return hook

    def drain(self) -> None:
        """Write the completions whose ops are on the ring (poll thread)."""
        queue, waiting = self._queue, self._waiting
        while queue:
            waiting.append((queue.popleft(), 0))
        keep: list[tuple[_Done, int]] = []
        for done, age in waiting:
            ref, seq, end, start = done
            if seq < ref.known or seq in ref.wrapped:
                self.tracer.done(end, ref.comm, seq, start)
                self.stats.written += 1
            elif age + 1 >= self.wait_ticks:
                self.stats.lost += 1
            else:
                keep.append((done, age + 1))
        self._waiting = keep


def register(pg: Any, ref: CommRef, gpu: GpuCompletions) -> bool:
    """Register ``gpu``'s hook on ``pg`` (a NCCL group); whether it took.

    torch refuses when ``TORCH_NCCL_ENABLE_TIMING`` was not set as the group
    was made, or when a hook is registered already; the wrappers' and the
    poll's completions stay then.
    """
    try:
        pg._register_on_completion_hook(gpu.hook_for(ref))
    except Exception as exc:  # noqa: BLE001 - whatever torch raises, trace on
        log.warning(
            "mycroft: no GPU completion times for group %s (%s); set %s=1 "
            "before the first process group, or call install() before it",
            ref.name,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            TIMING_ENV,
        )
        return False
    ref.gpu_done = True
    return True


def _op_name(op_type: Any) -> str:
    name = getattr(op_type, "name", None)
    return str(name if name is not None else op_type).rsplit(".", 1)[-1].upper()


def epoch_ns(t: Any) -> int:
    """``WorkInfo.time_*`` (a naive local ``datetime`` from pybind11, or
    seconds) as epoch ns."""
    if isinstance(t, datetime):
        return int(round(t.timestamp() * 1e6)) * 1000
    return int(float(t) * 1e9)


def duration_ns(d: Any) -> int:
    """``WorkInfo.active_duration`` (a ``timedelta``, or milliseconds) in ns."""
    if isinstance(d, timedelta):
        return (d // timedelta(microseconds=1)) * 1000
    return int(float(d) * 1e6)
