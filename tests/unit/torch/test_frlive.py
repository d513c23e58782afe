"""Flight Recorder live polling: entry -> op mapping, dedup, loss, completion.

``data/fr_gloo_ddp_r0.json`` is rank 0's recorder (entries and ``pg_status``,
no stacks) after a 2-rank gloo run on torch 2.13: a wrapped ``all_reduce``,
a DDP model built and stepped twice (all_gather, broadcasts, bucket
all-reduces), a barrier and one async all_reduce still in flight.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from mycroft.producers.ring_layout import DTYPES
from mycroft.producers.torch.frlive import FrPoller, fr_op
from mycroft.producers.torch.tracer import CommRef, Tracer, comm_hash
from mycroft.schemas.vocab import OP_NAMES

DATA = Path(__file__).parent / "data"


def captured() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / "fr_gloo_ddp_r0.json").read_text())
    return doc


class FakeTracer(Tracer):
    """Keeps the ops instead of writing a ring."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int, int, int]] = []  # (what, comm, seq, ts)
        self.issues: dict[tuple[int, int], tuple[int, int, int]] = {}

    def issued(  # noqa: PLR0917 - same signature as the tracer's
        self, ts_ns: int, comm: int, seq: int, nbytes: int, kind: int, dtype: int
    ) -> None:
        self.ops.append(("issued", comm, seq, ts_ns))
        self.issues[(comm, seq)] = (nbytes, kind, dtype)

    def done(self, ts_ns: int, comm: int, seq: int, start_ns: int) -> None:
        self.ops.append(("done", comm, seq, ts_ns))


class FakeRecorder:
    """A Flight Recorder ring of ``capacity`` entries with ``pg_status``."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self.entries: list[dict[str, Any]] = []
        self.status: dict[str, dict[str, int]] = {}
        self.next_rid = 0
        self.fail = False

    def add(self, entry: dict[str, Any], pg: str = "0") -> None:
        e = dict(entry, record_id=self.next_rid)
        self.next_rid += 1
        self.entries = [*self.entries, e][-self.capacity :]
        st = self.status.setdefault(
            pg, {"last_enqueued_collective": 0, "last_completed_collective": 0}
        )
        st["last_enqueued_collective"] = int(e["collective_seq_id"])
        if e.get("retired"):
            st["last_completed_collective"] = int(e["collective_seq_id"])

    def dump(self, include_entries: bool) -> bytes:
        if self.fail:
            raise RuntimeError("recorder gone")
        doc: dict[str, Any] = {"version": "2.10", "pg_status": self.status}
        if include_entries:
            doc["entries"] = self.entries
        return pickle.dumps(doc)


def entry(seq: int, retired: bool = True, n: int = 4, pg: str = "0") -> dict[str, Any]:
    return {
        "collective_seq_id": seq,
        "pg_id": int(pg),
        "profiling_name": "gloo:all_reduce",
        "process_group": (pg, "default_pg"),
        "input_sizes": [[n]],
        "input_dtypes": ["Float"],
        "time_created_ns": 1_000 + seq,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": retired,
        "is_p2p": False,
    }


class Clock:
    def __init__(self) -> None:
        self.ns = 10**18

    def __call__(self) -> int:
        return self.ns

    def tick(self, s: float) -> None:
        self.ns += int(s * 1e9)


def poller(
    rec: FakeRecorder, refs: dict[str, CommRef], period_s: float = 0.0
) -> tuple[FrPoller, FakeTracer, Clock]:
    tracer, clock = FakeTracer(), Clock()
    p = FrPoller(tracer, [rec.dump], refs.get, rec.capacity, period_s, clock)
    return p, tracer, clock


def world_ref() -> CommRef:
    return CommRef(comm_hash("0"), (0, 1), "world")


def test_captured_ddp_entries_map_to_ops() -> None:
    ops = [fr_op(e) for e in captured()["entries"]]
    assert all(op is not None for op in ops)
    got = [(o.seq, OP_NAMES[o.kind], o.nbytes, DTYPES[o.dtype]) for o in ops if o]
    assert got == [
        (0, "allreduce", 32, "float32"),  # the script's own all_reduce
        (1, "allgather", 8, "int64"),  # DDP: parameter shape check
        (2, "broadcast", 96, "int64"),
        (3, "broadcast", 4680 * 4, "float32"),  # DDP: the parameters
        (4, "allreduce", 4680 * 4, "float32"),  # bucket, step 1
        (5, "broadcast", 20, "int32"),  # bucket rebuild
        (6, "broadcast", 4, "int32"),
        (7, "allreduce", 4680 * 4, "float32"),  # bucket, step 2
        (8, "barrier", 0, "unknown"),
        (9, "allreduce", 24, "float64"),  # async, still in flight
    ]
    assert all(o.pg == "0" and o.created_ns > 1.7e18 for o in ops if o)
    assert [o.retired for o in ops if o][-2:] == [True, False]
    assert all(o.started_ns == 0 and o.completed_ns == 0 for o in ops if o)


def test_nccl_times_and_p2p() -> None:
    e = dict(
        entry(3, retired=False),
        profiling_name="nccl:all_reduce",
        time_discovered_started_ns=5_000,
        time_discovered_completed_ns=9_000,
    )
    op = fr_op(e)
    assert op is not None and (op.started_ns, op.completed_ns) == (5_000, 9_000)
    assert fr_op(dict(e, is_p2p=True, profiling_name="nccl:send")) is None


def test_captured_run_is_written_once_beside_the_wrapped_call() -> None:
    doc = captured()
    rec = FakeRecorder()
    rec.entries, rec.status = doc["entries"], doc["pg_status"]
    ref = world_ref()
    ref.wrapped[0] = 32  # the script's all_reduce went through the wrapper
    p, tracer, clock = poller(rec, {"0": ref})
    p.poll()
    issued = [seq for what, _c, seq, _t in tracer.ops if what == "issued"]
    assert issued == list(range(1, 10))
    done = {seq for what, _c, seq, _t in tracer.ops if what == "done"}
    assert done == set(range(1, 9))  # seq 9 is in flight
    assert (p.stats.deduped, p.stats.mismatched, p.stats.lost) == (1, 0, 0)
    assert tracer.issues[(ref.comm, 8)] == (0, OP_NAMES.index("barrier"), 0)
    rec.status["0"]["last_completed_collective"] = 10
    clock.tick(0.1)
    p.poll()
    assert tracer.ops[-1] == ("done", ref.comm, 9, clock.ns)
    assert p.stats.reads == 1  # nothing new to read: the header said so
    assert ref.known == 10 and not ref.wrapped


def test_incremental_by_record_id_and_no_read_when_all_wrapped() -> None:
    rec, ref = FakeRecorder(), world_ref()
    p, tracer, _clock = poller(rec, {"0": ref})
    for seq in (1, 2):
        ref.wrapped[seq - 1] = 16
        rec.add(entry(seq))
    p.poll()  # one read tells which group the status id 0 is
    assert p.stats.reads == 1 and tracer.ops == [] and ref.known == 2
    ref.wrapped[2] = 16
    rec.add(entry(3))
    p.poll()
    assert p.stats.reads == 1  # all wrapped: the header says so
    rec.add(entry(4))  # from C++
    rec.add(entry(5))
    p.poll()
    rec.add(entry(6))
    p.poll()
    assert [s for w, _c, s, _t in tracer.ops if w == "issued"] == [3, 4, 5]
    assert p.stats.entries == 6 and p.stats.deduped == 3  # 0, 1, 2: wrapped


def test_mismatched_numbering_is_counted() -> None:
    rec, ref = FakeRecorder(), world_ref()
    p, _tracer, _clock = poller(rec, {"0": ref})
    rec.add(entry(1))  # C++; the wrapper's op is seq 1 with other bytes
    ref.wrapped[1] = 999
    rec.add(entry(2))
    p.poll()
    assert (p.stats.deduped, p.stats.mismatched) == (1, 1)


def test_overwritten_entries_are_counted_lost_and_skipped() -> None:
    rec, ref = FakeRecorder(capacity=4), world_ref()
    p, tracer, _clock = poller(rec, {"0": ref})
    rec.add(entry(1))
    p.poll()
    for seq in range(2, 12):  # 10 ops between two polls, a ring of 4
        rec.add(entry(seq))
    p.poll()
    assert p.stats.lost == 6
    assert [s for w, _c, s, _t in tracer.ops if w == "issued"] == [0, 7, 8, 9, 10]
    assert ref.known == 11
    p.poll()
    assert p.stats.reads == 2  # the lost ones are not waited for


def test_reads_wait_for_the_period_unless_half_the_ring_is_unread() -> None:
    rec, ref = FakeRecorder(capacity=8), world_ref()
    p, _tracer, clock = poller(rec, {"0": ref}, period_s=0.5)
    rec.add(entry(1))
    p.poll()  # the first read is due at once
    rec.add(entry(2))
    clock.tick(0.1)
    p.poll()
    assert p.stats.reads == 1
    clock.tick(0.5)
    p.poll()
    assert p.stats.reads == 2
    for seq in range(3, 7):  # 4 unread = half the ring
        rec.add(entry(seq))
    clock.tick(0.1)
    p.poll()
    assert p.stats.reads == 3 and p.stats.lost == 0


def test_gloo_counts_point_to_point_in_its_status() -> None:
    rec, ref = FakeRecorder(), world_ref()
    ref.counts_p2p, ref.p2p_calls = True, 1
    p, _tracer, _clock = poller(rec, {"0": ref})
    ref.wrapped[0] = 16
    rec.add(entry(1))
    p.poll()
    ref.wrapped[1] = 16
    rec.add(entry(2))
    rec.status["0"]["last_enqueued_collective"] = 3  # one send counted too
    p.poll()
    assert p.stats.reads == 1 and ref.known == 2


def test_other_groups_unknown_groups_and_failures() -> None:
    rec, ref = FakeRecorder(), world_ref()
    sub = CommRef(comm_hash("1"), (0,), "tp")
    p, tracer, _clock = poller(rec, {"0": ref, "1": sub})
    rec.add(entry(1, pg="1"), pg="1")
    rec.add(entry(1, pg="7"), pg="7")  # this rank is not a member
    p.poll()
    assert [(c, s) for w, c, s, _t in tracer.ops if w == "issued"] == [(sub.comm, 0)]
    rec.fail = True
    p.poll()  # never raises
    assert p.stats.errors == 1 and "gone" in p.stats.last_error


def test_pause_and_resume_skip_what_ran_meanwhile() -> None:
    rec, ref = FakeRecorder(), world_ref()
    p, tracer, _clock = poller(rec, {"0": ref})
    p.pause()
    rec.add(entry(1))
    p.poll()
    p.resume()
    rec.add(entry(2))
    p.poll()
    assert [s for w, _c, s, _t in tracer.ops if w == "issued"] == [1]
    assert p.stats.lost == 0


@pytest.fixture
def ddp1(tmp_path: Path) -> Any:
    """A 1-rank gloo group traced with the Flight Recorder polled every 20 ms."""
    dist = pytest.importorskip("torch.distributed")
    import datetime  # noqa: PLC0415

    from mycroft.producers import torch as mt  # noqa: PLC0415

    tracer = mt.install(
        ring_dir=tmp_path / "rings", beat_s=0.02, keep_ring=True, fr_poll_s=0.0
    )
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(str(tmp_path / "store"), 1),
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        yield dist, tracer, mt._state["patcher"].poller
    finally:
        dist.destroy_process_group()
        mt.uninstall()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_ddp_ops_reach_the_ring_once(ddp1: Any, tmp_path: Path) -> None:
    import time  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from mycroft.producers import ring_layout as L  # noqa: PLC0415
    from mycroft.producers.ring import RingReader  # noqa: PLC0415

    dist, _tracer, fr = ddp1
    dist.all_reduce(torch.ones(4))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    for _ in range(3):
        model(torch.ones(2, 16)).sum().backward()
    dist.all_reduce(torch.ones(2))
    deadline = time.monotonic() + 5
    while fr.stats.emitted < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    (path,) = (tmp_path / "rings").glob("*.ring")
    recs = RingReader(path).poll()
    issued = [r for r in recs if isinstance(r, L.OpIssued) and r.comm == comm_hash("0")]
    seqs = [r.seq for r in issued]
    assert len(seqs) == len(set(seqs)) and sorted(seqs) == list(range(len(seqs)))
    kinds = [OP_NAMES[r.kind] for r in sorted(issued, key=lambda r: r.seq)]
    assert kinds[0] == kinds[-1] == "allreduce"  # the two wrapped calls
    assert kinds.count("broadcast") >= 1 and kinds.count("allreduce") >= 5
    done = {r.seq for r in recs if isinstance(r, L.OpDone)}
    assert set(seqs) <= done
    assert fr.stats.deduped >= 1 and fr.stats.lost == 0 and fr.stats.errors == 0


def test_recorded_copy_is_not_mutated() -> None:
    doc = captured()
    before = copy.deepcopy(doc)
    [fr_op(e) for e in doc["entries"]]
    assert doc == before


def test_a_group_made_again_under_the_same_name() -> None:
    """destroy + init again in one process: the old group's status stays."""
    rec, ref = FakeRecorder(), world_ref()
    for seq in (1, 2, 3):
        rec.add(entry(seq))  # the first group "0" (id 0), before tracing
    p, tracer, _clock = poller(rec, {"0": ref})
    p.start()
    for seq in (1, 2):
        rec.add(dict(entry(seq), pg_id=1), pg="1")  # the new group "0" (id 1)
    p.poll()
    assert [s for w, _c, s, _t in tracer.ops if w == "issued"] == [0, 1]
    assert ref.known == 2 and p.stats.lost == 0
    p.poll()
    assert p.stats.reads == 1  # the old id's count is not read as unread


def test_fr_capacity_asks_for_a_small_ring_only_when_unset() -> None:
    from mycroft.producers.torch import fr_capacity  # noqa: PLC0415

    env: dict[str, str] = {}
    assert fr_capacity(env, recorder_made=False) == 128
    assert env == {"TORCH_FR_BUFFER_SIZE": "128"}
    assert fr_capacity({}, recorder_made=True) == 2000  # torch's, already in force
    assert fr_capacity({"TORCH_FR_BUFFER_SIZE": "4000"}, recorder_made=False) == 4000
    assert (
        fr_capacity({"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}, recorder_made=False) == 64
    )
    assert fr_capacity({"TORCH_FR_BUFFER_SIZE": "0"}, recorder_made=False) == 0


def test_recorder_dumps_of_the_build() -> None:
    from mycroft.producers.torch.frlive import recorder_dumps  # noqa: PLC0415

    calls: list[tuple[str, tuple[Any, ...]]] = []

    class C10d:
        @staticmethod
        def _dump_fr_trace(*args: Any) -> bytes:
            calls.append(("fr", args))
            return b""

        @staticmethod
        def _dump_nccl_trace(*args: Any) -> bytes:
            calls.append(("nccl", args))
            return b""

    assert len(recorder_dumps(C10d, nccl=False)) == 1
    for dump in recorder_dumps(C10d, nccl=True):
        dump(True)
    assert calls == [("fr", (True, False, False)), ("nccl", (True, False, False))]
    assert recorder_dumps(object(), nccl=True) == []  # before 2.8 on CPU: no poll


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_without_the_recorder_the_wrappers_number_ops(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    import datetime  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from mycroft.producers import ring_layout as L  # noqa: PLC0415
    from mycroft.producers import torch as mt  # noqa: PLC0415
    from mycroft.producers.ring import RingReader  # noqa: PLC0415

    mt.install(ring_dir=tmp_path / "rings", keep_ring=True, flight_recorder=False)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(str(tmp_path / "store"), 1),
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        assert mt._state["patcher"].poller is None
        t = torch.ones(2)
        dist.all_reduce(t)
        mt.pause()
        dist.all_reduce(t)
        mt.resume()
        dist.all_reduce(t)
        (path,) = (tmp_path / "rings").glob("*.ring")
        recs = RingReader(path).poll()
        assert [r.seq for r in recs if isinstance(r, L.OpIssued)] == [0, 1]
    finally:
        dist.destroy_process_group()
        mt.uninstall()


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
def test_functional_collectives_reach_the_ring(ddp1: Any, tmp_path: Path) -> None:
    """DTensor's collectives (``_functional_collectives``) bypass ``dist.*``;
    the recorder has them."""
    import time  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed._functional_collectives as fc  # noqa: PLC0415

    from mycroft.producers import ring_layout as L  # noqa: PLC0415
    from mycroft.producers.ring import RingReader  # noqa: PLC0415

    dist, _tracer, fr = ddp1
    group = dist.distributed_c10d._get_default_group()
    dist.all_reduce(torch.ones(2))
    fc.wait_tensor(fc.all_reduce(torch.ones(4), "sum", group))
    fc.wait_tensor(fc.all_gather_tensor(torch.ones(3), 0, group))
    dist.all_reduce(torch.ones(2))
    deadline = time.monotonic() + 5
    while fr.stats.emitted < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    (path,) = (tmp_path / "rings").glob("*.ring")
    issued = [r for r in RingReader(path).poll() if isinstance(r, L.OpIssued)]
    got = sorted((r.seq, OP_NAMES[r.kind], r.nbytes) for r in issued)
    assert got == [
        (0, "allreduce", 8),
        (1, "allreduce", 16),
        (2, "allgather", 12),
        (3, "allreduce", 8),
    ]
