"""GPU completion times of NCCL groups (``producers/torch/nccl_done.py``).

No GPU here: ``WorkInfo`` values are built the way pybind11 hands them to
the hook (naive local ``datetime``, ``timedelta``, torch's ``OpType``), and
the Flight Recorder is the fake of ``test_frlive``. ``gpu_check.py`` runs
the same path on a GPU machine.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mycroft.producers.torch import _torch_fr_default, fr_capacity
from mycroft.producers.torch.nccl_done import (
    GpuCompletions,
    duration_ns,
    epoch_ns,
    register,
)
from mycroft.producers.torch.tracer import CommRef, Tracer, comm_hash
from tests.unit.torch.test_frlive import FakeRecorder, FakeTracer, entry, poller

END_S = 1_767_225_600.25  # 2026-01-01, a quarter second in


class DoneTracer(FakeTracer):
    """Keeps each OP_DONE's start too."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: dict[tuple[int, int], int] = {}

    def done(self, ts_ns: int, comm: int, seq: int, start_ns: int) -> None:
        super().done(ts_ns, comm, seq, start_ns)
        self.starts[(comm, seq)] = start_ns


def op_type(name: str) -> Any:
    """torch's ``OpType`` member when torch is here, else a stand-in."""
    try:
        import torch._C._distributed_c10d as c10d  # noqa: PLC0415

        return getattr(c10d.OpType, name)
    except ImportError:
        return SimpleNamespace(name=name)


def work_info(seq: int, op: str = "ALLREDUCE", gpu_ms: float = 2.5) -> Any:
    end = datetime.fromtimestamp(END_S)  # naive local time, as pybind11 makes it
    return SimpleNamespace(
        op_type=op_type(op),
        seq=seq,
        time_started=end - timedelta(seconds=1),
        time_finished=end,
        active_duration=timedelta(milliseconds=gpu_ms),
    )


def dones(tracer: FakeTracer) -> list[tuple[int, int]]:
    return [(comm, seq) for what, comm, seq, _ in tracer.ops if what == "done"]


def test_times_as_pybind11_gives_them() -> None:
    assert epoch_ns(datetime.fromtimestamp(END_S)) == int(END_S * 1e6) * 1000
    assert duration_ns(timedelta(milliseconds=2.5)) == 2_500_000
    assert duration_ns(2.5) == 2_500_000  # milliseconds, if a build hands a float


def test_completion_of_a_wrapped_collective_is_its_done_at_gpu_times() -> None:
    tracer, ref = DoneTracer(), CommRef(comm_hash("0"), (0, 1), "world")
    ref.wrapped[2] = 16  # the wrapper wrote OP_ISSUED of the third collective
    gpu = GpuCompletions(tracer)
    gpu.hook_for(ref)(work_info(3))  # torch's seq counts from 1
    assert dones(tracer) == []  # the hook only queues
    gpu.drain()
    end = int(END_S * 1e6) * 1000
    assert tracer.ops == [("done", ref.comm, 2, end)]
    assert tracer.starts[(ref.comm, 2)] == end - 2_500_000
    assert gpu.stats.written == 1


def test_a_cpp_issued_op_completes_after_the_poll_wrote_it() -> None:
    rec, ref = FakeRecorder(), CommRef(comm_hash("0"), (0, 1), "world")
    p, tracer, _ = poller(rec, {"0": ref})
    pg = SimpleNamespace(hooks=[])
    pg._register_on_completion_hook = pg.hooks.append
    gpu = GpuCompletions(tracer, wait_ticks=3)
    assert register(pg, ref, gpu) and ref.gpu_done
    rec.add(entry(1, retired=True))  # a DDP bucket all-reduce, done on the GPU
    pg.hooks[0](work_info(1))
    gpu.drain()  # before the poll: not on the ring yet, it waits
    assert dones(tracer) == []
    p.poll()
    assert [op[:3] for op in tracer.ops] == [("issued", ref.comm, 0)]  # no done
    gpu.drain()
    assert dones(tracer) == [(ref.comm, 0)]


def test_unwritten_p2p_garbage_and_overflow_are_counted() -> None:
    tracer, ref = DoneTracer(), CommRef(comm_hash("0"), (0, 1), "world")
    gpu = GpuCompletions(tracer, wait_ticks=2, max_queued=2)
    hook = gpu.hook_for(ref)
    hook(work_info(1, op="SEND"))
    hook(work_info(1, op="RECV"))
    hook(SimpleNamespace(op_type=op_type("ALLREDUCE"), seq="x"))  # must not raise
    hook(work_info(7))
    hook(work_info(8))
    hook(work_info(9))  # over max_queued
    gpu.drain()
    gpu.drain()  # the ops never reached the ring: lost after 2 ticks
    assert dones(tracer) == []
    s = gpu.stats
    assert (s.seen, s.p2p, s.errors, s.dropped, s.lost) == (6, 2, 1, 1, 2)
    assert s.last_error


def test_a_refused_hook_leaves_the_other_completions() -> None:
    def refuse(_hook: Any) -> None:
        raise ValueError("requires setting TORCH_NCCL_ENABLE_TIMING")

    ref = CommRef(comm_hash("0"), (0, 1), "world")
    pg = SimpleNamespace(_register_on_completion_hook=refuse)
    assert not register(pg, ref, GpuCompletions(DoneTracer()))
    assert not ref.gpu_done


def test_recorder_default_by_torch_version(monkeypatch: pytest.MonkeyPatch) -> None:
    for version, want in (("2.8.0+cu128", 0), ("2.10.0", 0), ("2.13.0+cpu", 2000)):
        monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(__version__=version))
        assert _torch_fr_default() == want
    assert fr_capacity({}, recorder_made=True, torch_default=0) == 0
    assert fr_capacity({}, recorder_made=True, torch_default=2000) == 2000


def test_gpu_check_reads_a_ring(tmp_path: Path) -> None:
    from mycroft.producers.torch.gpu_check import check_ring  # noqa: PLC0415

    tracer = Tracer(tmp_path, nslots=256, beat_s=60.0, unlink_at_exit=False)
    tracer.open(0)
    comm, t0 = comm_hash("0"), 10**18
    for seq in range(3):
        tracer.issued(t0 + seq, comm, seq, 64, 1, 0)
        tracer.done(t0 + 5_000_000 + seq, comm, seq, t0 + 3_000_000)
    tracer.done(t0 + 6_000_000, comm, 2, t0 + 3_000_000)  # a second OP_DONE
    tracer.close()
    hook = {"hook": {"errors": 0, "lost": 0, "dropped": 0}, "groups_with_hook": 1}
    ring = next(tmp_path.glob("torch-r0-p*.ring"))
    summary, bad = check_ring(ring, hook | {"groups": 1})
    assert summary["collectives"] == 3
    assert summary["gpu_ms"]["p50"] == 2.0
    assert bad == [f"op {(comm, 2)}: 2 OP_DONE"]
