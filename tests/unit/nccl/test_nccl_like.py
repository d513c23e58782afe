"""The plugin under NCCL's own call sequence (issue #54), read back from its rings.

Each scenario is what an application does; ``nccl_like`` turns it into the
profiler calls NCCL 2.27-2.30 makes (loader, API and task events, proxy
thread, net.cc steps, kernel channels) and fails when NCCL's side would break
(loader refcount at 0 under a live communicator, a call into an unloaded
plugin).
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from mycroft.producers.ring_layout import (
    DTYPES,
    Comm,
    CommName,
    FlowProgress,
    FlowSteps,
    Kind,
    OpDone,
    OpIssued,
)
from mycroft.schemas import vocab
from tests.unit.nccl.harness import SOURCE, build
from tests.unit.nccl.nccl_like import RELEASES, Binaries, Run, Scenario, check, run

HERE = Path(__file__).resolve().parent


def _keys(records: list[OpIssued] | list[OpDone]) -> Counter[tuple[int, int]]:
    return Counter((r.comm, r.seq) for r in records)


def _comm_id(r: Run, name: str) -> int:
    """The ring id of the communicator whose COMM_NAME is ``name``."""
    ids = {c.comm for c in r.of(CommName) if c.text == name}
    assert len(ids) == 1, (name, ids)
    return int(ids.pop())


def _one_op_per_key(r: Run) -> tuple[list[OpIssued], list[OpDone]]:
    issued, done = r.ops()
    assert max(_keys(issued).values(), default=1) == 1, "two ops share a (comm, seq)"
    assert max(_keys(done).values(), default=1) == 1, "an op is done twice"
    return issued, done


@pytest.mark.parametrize("release", ["2.27", "2.30"])
def test_each_function_s_first_op_is_its_own_op(tmp_path: Path, release: str) -> None:
    """NCCL numbers ops per function: AllReduce #0, AllGather #0 and ReduceScatter #0
    all carry coll.seqNumber 0 (profiler.cc:489); the ring keeps them apart."""
    s = Scenario().comm("A", nranks=4, rank=1)
    s.allreduce("A", count=1000)
    s.allgather("A", count=3000)  # bytes as ncclInt8 (enqueue.cc:2733-2737)
    s.reducescatter("A", count=700, dtype="ncclFloat64")
    s.allreduce("A", count=10)
    r = check(run(s.wait().flush(), tmp_path, release))
    issued, done = _one_op_per_key(r)
    ops = {o.seq: o for o in issued}
    assert sorted(ops) == [0, 1, 2, 3]
    kinds = [
        vocab.OP_NAMES.index(k) for k in ("allreduce", "allgather", "reducescatter")
    ]
    got = [(ops[i].kind, ops[i].nbytes, ops[i].func_seq) for i in range(4)]
    assert got == [
        (kinds[0], 4000, 0),
        (kinds[1], 3000 * 4, 0),
        (kinds[2], 5600, 0),
        (kinds[0], 40, 1),
    ]
    assert sorted(d.seq for d in done) == [0, 1, 2, 3]
    assert {d.nflows for d in done} == {
        4
    }  # a send and a recv flow on each of 2 channels


@pytest.mark.parametrize("release", ["2.27", "2.30"])
def test_graph_replays_are_distinct_ops(tmp_path: Path, release: str) -> None:
    """A captured AllReduce replayed 5 times: 5 ops, each done once. NCCL bumps
    seqNumber for a persistent plan only under a non-NULL Group or CollApi handle
    with KernelCh asked for (profiler.cc:511-515)."""
    s = Scenario().comm("A").capture("g").allreduce("A").end_capture()
    s.replay("g", times=5)
    r = check(run(s.wait().flush(), tmp_path, release))
    issued, done = _one_op_per_key(r)
    assert sorted(o.seq for o in issued) == [0, 1, 2, 3, 4]
    assert sorted(o.func_seq for o in issued) == [0, 1, 2, 3, 4]
    assert sorted(d.seq for d in done) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("release", RELEASES)
def test_communicator_churn_keeps_every_comm_profiled(
    tmp_path: Path, release: str
) -> None:
    """200 communicators created and destroyed one after another (pool: 64) beside
    a long-lived one; the loader's refcount never reaches 0 under a live comm."""
    churn = 200
    s = Scenario().comm("L")
    for i in range(churn):
        s.comm(f"C{i}").allreduce(f"C{i}", nch=1, steps=2).allreduce(
            "L", nch=1, steps=2
        )
        s.wait().destroy(f"C{i}")
    r = check(run(s.wait().flush(), tmp_path, release))
    assert all(i.rc == 0 and i.ctx for i in r.inits.values()), r.inits
    _, done = _one_op_per_key(r)
    long_lived = _comm_id(r, "L")
    assert sorted(d.seq for d in done if d.comm == long_lived) == list(range(churn))
    per_comm = Counter(d.comm for d in done if d.comm != long_lived)
    assert len(per_comm) == churn and set(per_comm.values()) == {1}
    assert r.beat().dropped_comms == 0


def test_never_stopped_proxy_ops_and_an_abort_do_not_starve_later_ops(
    tmp_path: Path,
) -> None:
    """2,000 CollNet ProxyOps NCCL starts and never steps or stops, then a
    communicator aborted mid-op: the next 10 ops are all recorded."""
    s = Scenario().comm("A")
    for _ in range(5):
        for _ in range(200):
            s.allreduce("A", net="collnet", nch=1)  # 2 ProxyOps each (coll_net.cc)
        s.wait().tick().tick()
    s.comm("B").allreduce("B", hang=1).wait().abort("B")
    for _ in range(10):
        s.allreduce("A")
    s.wait().tick().tick().flush()
    pools = {"MYCROFT_NCCL_OPS": "512", "MYCROFT_NCCL_FLOWS": "1024"}
    r = check(run(s, tmp_path, env=pools))
    a = _comm_id(r, "A")
    _, done = r.ops(a)
    assert set(range(1000, 1010)) <= {d.seq for d in done}
    beat = r.beat()
    assert (beat.dropped_ops, beat.dropped_flows) == (0, 0)
    assert beat.orphan_flows == 2000
    assert beat.abandoned_ops >= 1


@pytest.mark.parametrize(
    ("ops_per_s", "seconds", "peers"),
    [(20000, 1.0, 0), (50000, 1.0, 0), (20000, 1.0, 4)],
)
def test_real_op_rates_with_the_default_tick_drop_nothing(
    tmp_path: Path, ops_per_s: int, seconds: float, peers: int
) -> None:
    """Ops at 20k-50k/s (all-to-all: one P2p op per peer and direction) with the
    tick thread and pools at their defaults: no drop, every op done."""
    args = (
        "--rate",
        str(ops_per_s),
        "--seconds",
        str(seconds),
        "--p2p-peers",
        str(peers),
    )
    kinds = frozenset({Kind.OP_ISSUED, Kind.OP_DONE, Kind.BEAT})
    r = check(run(None, tmp_path, tick_ms=None, args=args, kinds=kinds))
    assert r.summary["errors"] == 0
    issued, done = _one_op_per_key(r)
    beat = r.beat()
    assert (beat.dropped_comms, beat.dropped_ops, beat.dropped_flows) == (0, 0, 0)
    assert len(issued) == r.summary["ops"]
    assert _keys(done) == _keys(issued)


def test_two_ranks_in_one_process_write_two_rings(tmp_path: Path) -> None:
    """ncclCommInitAll over two devices (nccl-tests -g 2): one ring per device,
    each with its own rank in the header, no record of the other rank."""
    s = Scenario().comms("A", "B", nranks=2)
    s.add("group").allreduce("A").allreduce("B").add("end")
    r = check(run(s.wait().flush(), tmp_path))
    assert sorted(r.rings) == [0, 1]
    for dev in (0, 1):
        ring = r.rings[dev]
        assert ring.header.rank == dev
        assert {c.comm_rank for c in r.of(Comm, dev)} == {dev}
        assert len(r.of(OpIssued, dev)) == len(r.of(OpDone, dev)) == 1
        flows = r.of(FlowProgress, dev)
        assert flows and {f.peer for f in flows} == {1 - dev}


def test_a_split_sharing_its_parent_s_proxy_thread_keeps_its_own_ops(
    tmp_path: Path,
) -> None:
    """ncclCommSplit with splitShare: one proxy thread serves both communicators
    (init.cc:1525-1527); each ProxyOp carries its own comm's context."""
    s = Scenario().comm("A").comm("S", share="A", nranks=4)
    s.allreduce("A").allreduce("S").allreduce("A")
    r = check(run(s.wait().flush(), tmp_path))
    a, split = _comm_id(r, "A"), _comm_id(r, "S")
    assert sorted(d.seq for d in r.ops(a)[1]) == [0, 1]
    (done,) = r.ops(split)[1]
    assert (done.seq, done.nflows) == (0, 4)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("cause", ["full_pool", "failed_setup"])
def test_init_never_fails_and_the_loader_stays_sound(
    tmp_path: Path, release: str, cause: str
) -> None:
    """A full communicator pool or a failed setup: every init returns ncclSuccess,
    so no release unloads the plugin under a live communicator (2.30.3+), turns
    it off for the process (2.27) or runs a comm on an error (2.28-2.29)."""
    s = Scenario().comm("A").comm("B").allreduce("A").allreduce("B").wait()
    s.destroy("B").allreduce("A").wait().comm("C").destroy("C")
    s.allreduce("A").wait().flush().destroy("A")
    env = (
        {"MYCROFT_NCCL_COMMS": "1"}
        if cause == "full_pool"
        else {"MYCROFT_NCCL_RING_DIR": "/dev/null/rings"}
    )
    r = check(run(s, tmp_path, release, env=env))
    assert {n: i.rc for n, i in r.inits.items()} == {"A": 0, "B": 0, "C": 0}
    if cause == "failed_setup":
        assert not r.rings
        assert {i.mask for i in r.inits.values()} == {0}
        return
    assert [n for n, i in r.inits.items() if i.ctx] == ["A"]
    a = _comm_id(r, "A")
    assert len(r.ops(a)[1]) == 3
    assert {d.comm for d in r.of(OpDone)} == {a}  # B's events came with a NULL ctx
    assert r.beat().dropped_comms == 2


def test_send_ready_wait_grows_while_the_head_step_waits(tmp_path: Path) -> None:
    """isend refuses the head step (no credit) until released: NCCL repeats
    SendPeerWait (net.cc:1407) and marks no later step ready, so G <= T+1; the
    flow's ready_wait_us grows in every snapshot of the wait."""
    s = Scenario().comm("A").allreduce("A", nch=1, steps=8, hang=1, irecv_refuse=3)
    s.sleep(20).mark("stall")
    for _ in range(3):
        s.tick().sleep(40)
    s.mark("sent").release("A").wait().flush()
    r = check(run(s, tmp_path))
    sends = [f for f in r.of(FlowProgress) if f.direction == 0]
    assert sends and all(f.gpu_ready <= f.transmitted + 1 for f in sends), sends
    steps = [x for x in r.of(FlowSteps) if x.direction == 0]
    stall, sent = r.marks["stall"], r.marks["sent"]
    during = [x.ready_wait_us for x in steps if stall < x.ts_ns < sent]
    assert len(during) == 3 and during == sorted(set(during)), during
    assert steps[-1].ready_wait_us * 1000 >= sent - stall
    # a recv step restarted while irecv returned NULL (net.cc:1536) counts once
    last_recv = [x for x in r.of(FlowSteps) if x.direction == 1][-1]
    assert (last_recv.posted, last_recv.received) == (8, 8)


@pytest.mark.parametrize("release", ["2.29", "2.30"])
def test_ops_without_a_coll_event_are_counted_unseen(
    tmp_path: Path, release: str
) -> None:
    """Broadcast runs as AllGatherV from 2.29 (enqueue.cc:2703-2723): NCCL sends its
    CollApi event and no Coll event; the BEAT counts it."""
    s = Scenario().comm("A").broadcast("A").allreduce("A").wait()
    r = check(run(s.tick().tick().tick().flush(), tmp_path, release))
    assert r.beat().unseen_ops == 1
    assert len(r.ops()[1]) == 1


def test_nvls_tree_and_newer_datatypes_are_named(tmp_path: Path) -> None:
    s = Scenario().comm("A").allreduce("A", algo="NVLS_TREE", nch=1)
    dtypes = {
        "ncclUint32": 4,
        "ncclUint64": 8,
        "ncclFloat8e4m3": 1,
        "ncclFloat8e5m2": 1,
    }
    for dtype in dtypes:
        s.allreduce("A", count=1000, dtype=dtype, nch=1)
    r = check(run(s.wait().flush(), tmp_path))
    ops = sorted(r.of(OpIssued), key=lambda o: o.seq)
    assert ops[0].algo == vocab.ALGORITHMS.index("nvls_tree")
    got = [(DTYPES[o.dtype], o.nbytes) for o in ops[1:]]
    want = [(d[4:].lower(), 1000 * size) for d, size in dtypes.items()]
    assert got == want  # ncclUint32 -> "uint32", ...


def test_p2p_to_a_peer_beyond_1024_is_sequenced(tmp_path: Path) -> None:
    s = Scenario().comm("A", nranks=2048, rank=0).send("A", 1500).recv("A", 1500)
    r = check(run(s.wait().flush(), tmp_path))
    issued, done = _one_op_per_key(r)
    assert sorted(o.seq for o in issued) == [0, 0]
    assert len(done) == 2


def test_a_comm_s_finalize_leaves_other_comms_ops_alone(tmp_path: Path) -> None:
    """B is destroyed while A's op has run one of its two kernel channels: A's op
    is done only after its second channel, not at B's finalize."""
    s = Scenario().comm("A").comm("B")
    s.allreduce("A", nch=2, net="none", hold=1).wait().tick()
    s.destroy("B").mark("b_gone").release("A").wait().flush()
    r = check(run(s, tmp_path))
    a = _comm_id(r, "A")
    (done,) = r.ops(a)[1]
    assert done.ts_ns > r.marks["b_gone"]


@pytest.mark.parametrize("release", RELEASES)
def test_a_reload_after_the_last_communicator_keeps_recording(
    tmp_path: Path, release: str
) -> None:
    """The last commFree drops the refcount to 0: NCCL dlcloses the plugin
    (profiler.cc:113-125) and dlopens it again for the next communicator."""
    s = Scenario().comm("A").allreduce("A").wait().destroy("A")
    s.comm("B").allreduce("B").wait().flush().destroy("B")
    r = check(run(s, tmp_path, release))
    assert "loads=2 unloads=2" in r.stdout
    assert {d.comm for d in r.of(OpDone)} == {_comm_id(r, "A"), _comm_id(r, "B")}


@pytest.mark.parametrize(
    ("release", "error"),
    [
        ("2.27", "sets ncclProfiler = NULL for the whole process"),
        ("2.28", None),
        ("2.29", None),
        ("2.30", "loader refcount reached 0 while 1 communicator"),
    ],
)
def test_the_driver_reports_what_nccl_does_with_a_failed_init(
    tmp_path: Path, release: str, error: str | None
) -> None:
    """A plugin whose second init fails: 2.27 turns profiling off for the process
    (v2.27.7 profiler.cc:171-174), 2.30.3+ unloads at the failed init and again
    at that comm's commFree (profiler.cc:253, :268), 2.28-2.29 carry on."""
    build()
    stub = tmp_path / "libdeclining.so"
    subprocess.run(
        [shutil.which("cc") or "cc", "-std=c11", "-Wall", "-Werror", "-shared", "-fPIC",
         f"-I{SOURCE / 'include'}", "-o", str(stub), str(HERE / "declining_plugin.c")],
        check=True,
    )  # fmt: skip
    s = Scenario().comm("A").comm("B").destroy("B").allreduce("A").wait().destroy("A")
    r = run(s, tmp_path, release, binaries=Binaries(build() / "nccl_like", stub))
    assert r.inits["B"].rc == 3
    if error is None:
        check(r)
    else:
        assert r.returncode == 3 and error in r.stderr, r.stderr


@pytest.mark.parametrize("release", ["2.27", "2.30"])
def test_nccl_s_thread_split_has_no_data_race(tmp_path: Path, release: str) -> None:
    """Concurrent inits, a split sharing its parent's proxy thread, graph replays
    on the host-callback thread, proxy threads and a 1 ms tick, under TSan."""
    out = tmp_path / "tsan"
    made = subprocess.run(
        ["make", "-s", "-C", str(SOURCE), f"BUILD={out}",
         "CFLAGS=-O1 -g -fsanitize=thread -Wno-tsan",
         f"{out}/libnccl-profiler-mycroft.so", f"{out}/nccl_like"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"no ThreadSanitizer build here: {made.stderr[-300:]}")
    s = Scenario().comms("A", "B", nranks=2).comm("S", share="A", nranks=2, rank=0)
    s.add("group").allreduce("A").allreduce("B").add("end")
    s.add("alltoall", "A", peers=1, count=1024)
    s.capture("g").allreduce("S", nch=1).end_capture().replay("g", times=5)
    s.allreduce("A", net="collnet", nch=1).allreduce("A", stall=20)
    s.allgather("B", irecv_refuse=3)
    s.comm("X", nranks=4).allreduce("X", hang=1).wait().abort("X")
    s.wait().destroy("S").destroy("A").destroy("B")
    bins = Binaries(out / "nccl_like", out / "libnccl-profiler-mycroft.so")
    r = run(s, tmp_path, release, tick_ms=1, binaries=bins, timeout_s=240)
    assert "ThreadSanitizer" not in r.stderr, r.stderr[-4000:]
    check(r)
