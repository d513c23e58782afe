"""The NCCL profiler plugin, driven by the fake-NCCL harness, read back from its ring.

Every test builds an event script in the order NCCL's proxy calls the
profiler (Coll -> ProxyOp -> ProxyStep, ``src/transport/net.cc``), runs it
against the built ``.so`` and checks the records the Python reader decodes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import pytest

from mycroft.producers.ring import RingReader
from mycroft.producers.ring_layout import (
    Beat,
    Comm,
    CommName,
    FlowDone,
    FlowProgress,
    FlowSteps,
    OpDone,
    OpIssued,
    RingRecord,
)
from mycroft.schemas import vocab
from tests.unit.nccl.harness import (
    KERNEL_CH_STOP,
    SEND_GPU_WAIT,
    SEND_PEER_WAIT,
    SEND_WAIT,
    Script,
    run,
)

R = TypeVar("R")
HASH = 0xA1B2C3D4E5F60718
ABIS = (4, 5, 6)


def _one(records: list[R]) -> R:
    assert len(records) == 1, records
    return records[0]


def _world(s: Script, cid: int = 0, comm_hash: int = HASH, rank: int = 1) -> None:
    s.init(cid, comm_hash, 4, rank, 2, "world")


def _progress(r: list[RingRecord], channel: int, direction: int) -> list[FlowProgress]:
    return [
        x
        for x in r
        if isinstance(x, FlowProgress)
        and x.channel == channel
        and x.direction == direction
    ]


def _steps(r: list[RingRecord], channel: int, direction: int) -> list[FlowSteps]:
    return [
        x
        for x in r
        if isinstance(x, FlowSteps)
        and x.channel == channel
        and x.direction == direction
    ]


@pytest.mark.parametrize("abi", ABIS)
def test_send_flow_counts_each_stage(tmp_path: Path, abi: int) -> None:
    """posted / GPU-ready / transmitted (+bytes) / done advance independently."""
    s = Script()
    _world(s)
    op = s.coll(0, seq=7, count=1 << 20, nch=1)
    f = s.proxyop(op, channel=3, peer=2, nsteps=4, send=True)
    steps = [s.send_step(f, i, upto=4 - i, nbytes=1000 + i) for i in range(4)]
    s.flush()
    _, h1, h2, h3 = steps
    s.stop(h1)
    s.state(h2, SEND_WAIT, 1002)
    s.stop(h2)
    s.state(h3, SEND_PEER_WAIT, 0)
    s.state(h3, SEND_WAIT, 1003)
    s.stop(h3)
    s.stop(f)
    s.stop(op)
    s.flush()
    r = run(s, tmp_path, abi)
    assert r.corrupt == 0
    first, last = _progress(r.records, 3, 0)
    # step 0 done, 1 transmitted, 2 GPU-ready, 3 posted only
    assert (first.total, first.gpu_ready, first.transmitted, first.done) == (4, 3, 2, 1)
    steps0 = _steps(r.records, 3, 0)[0]
    assert (steps0.posted, steps0.nbytes) == (4, 1000 + 1001)
    assert (first.comm, first.seq, first.peer) == (HASH, 0, 2)  # the comm's first Coll
    assert (last.gpu_ready, last.transmitted, last.done) == (4, 4, 4)
    assert _steps(r.records, 3, 0)[-1].nbytes == 1000 + 1001 + 1002 + 1003
    done = _one(r.of(FlowDone))
    assert isinstance(done, FlowDone)
    assert (done.channel, done.direction, done.peer, done.chunks) == (3, 0, 2, 4)
    assert 0 < done.first_ns <= done.ts_ns
    end = _one(r.of(OpDone))
    assert isinstance(end, OpDone)
    assert (end.comm, end.seq, end.nflows) == (HASH, 0, 1)
    assert _one(r.of(OpIssued)).func_seq == 7  # NCCL's coll.seqNumber
    assert end.start_ns == done.first_ns and end.ts_ns == done.ts_ns


def test_wire_time_runs_from_each_send_wait_to_its_stop(tmp_path: Path) -> None:
    """A send's FLOW_DONE carries, summed over its steps, SendWait to stop:
    the wait for the data before SendWait is left out; a recv carries 0."""
    s = Script()
    _world(s)
    op = s.coll(0, seq=3, count=1 << 20, nch=1)
    send = s.proxyop(op, channel=0, peer=2, nsteps=2, send=True)
    recv = s.proxyop(op, channel=0, peer=0, nsteps=1, send=False)
    for i in range(2):
        h = s.send_step(send, i, upto=2)
        s.sleep(40)  # waiting for the data: not on the wire
        s.state(h, SEND_WAIT, 4096)
        s.sleep(25)  # on the wire
        s.stop(h)
    s.recv_step(recv, 0)
    for h in (send, recv, op):
        s.stop(h)
    s.flush()
    r = run(s, tmp_path)
    done = {x.direction: x for x in r.of(FlowDone) if isinstance(x, FlowDone)}
    assert done[1].wire_us == 0
    # two steps of 25 ms; sleep only ever oversleeps, by less than one 40 ms wait
    assert 50_000 <= done[0].wire_us < 90_000, done[0]


@pytest.mark.parametrize("abi", ABIS)
def test_recv_flow_counts_posted_received_handed_consumed(
    tmp_path: Path, abi: int
) -> None:
    """recv: G RecvWait (posted), RecvFlushWait (received), T handed, D consumed."""
    s = Script()
    _world(s)
    op = s.coll(0, seq=0, count=4096, nch=1)
    f = s.proxyop(op, channel=0, peer=3, nsteps=5, send=False)
    for i in range(5):
        s.recv_step(f, i, upto=4 - i, nbytes=100 * (i + 1), stale=77)
    s.flush()
    r = run(s, tmp_path, abi)
    p = _one(_progress(r.records, 0, 1))
    assert isinstance(p, FlowProgress)
    # steps 0..3 posted, 0..2 received, 0..1 handed, 0 consumed; step 4 not started
    assert (p.total, p.gpu_ready, p.transmitted, p.done) == (5, 4, 2, 1)
    st = _one(_steps(r.records, 0, 1))
    assert isinstance(st, FlowSteps)
    assert (st.posted, st.received, st.nbytes) == (4, 3, 100 + 200 + 300)
    assert r.of(OpDone) == []  # the flow and the op are still open


def test_stale_trans_size_only_counted_at_send_wait(tmp_path: Path) -> None:
    s = Script()
    _world(s)
    op = s.coll(0, seq=1, count=1024, nch=1)
    f = s.proxyop(op, channel=1, peer=0, nsteps=3, send=True)
    for i in range(3):
        h = s.send_step(f, i, upto=3, nbytes=512, stale=1 << 30)
        s.state(h, SEND_WAIT, 1 << 30)  # a repeated SendWait is not a new transfer
        s.state(h, SEND_GPU_WAIT, 1 << 30)
        s.stop(h)
    s.flush()
    r = run(s, tmp_path)
    assert _steps(r.records, 1, 0)[-1].nbytes == 3 * 512
    assert _progress(r.records, 1, 0)[-1].transmitted == 3


def test_retried_send_peer_wait_counts_once(tmp_path: Path) -> None:
    """isend returning no request repeats SendPeerWait; G counts the step once."""
    s = Script()
    _world(s)
    op = s.coll(0, seq=2, count=1024, nch=1)
    f = s.proxyop(op, channel=0, peer=1, nsteps=2, send=True)
    s.send_step(f, 0, upto=2, retries=9)
    s.send_step(f, 1, upto=1)
    s.flush()
    p = _one(_progress(run(s, tmp_path).records, 0, 0))
    assert isinstance(p, FlowProgress)
    assert (p.gpu_ready, p.transmitted, p.done) == (1, 0, 0)


def test_steps_in_slices_reuse_step_handles(tmp_path: Path) -> None:
    """nSteps counts slices; step ids run past NCCL_STEPS and share pHandles slots."""
    s = Script()
    _world(s)
    op = s.coll(0, seq=3, count=1 << 22, nch=1)
    f = s.proxyop(op, channel=0, peer=1, nsteps=20, send=True)
    for i in range(20):
        s.send_step(f, i, nbytes=1 << 16)
    s.stop(f)
    s.stop(op)
    s.flush()
    r = run(s, tmp_path)
    p = _progress(r.records, 0, 0)[-1]
    assert (p.total, p.gpu_ready, p.transmitted, p.done) == (20, 20, 20, 20)
    assert _steps(r.records, 0, 0)[-1].nbytes == 20 << 16
    assert _one(r.of(FlowDone)).chunks == 20


def test_op_issued_and_comm_records(tmp_path: Path) -> None:
    s = Script()
    _world(s)
    op = s.coll(
        0,
        seq=11,
        count=3000,
        nch=2,
        func="ReduceScatter",
        dtype="ncclBfloat16",
        algo="TREE",
        proto="LL128",
    )
    f = s.proxyop(op, channel=0, peer=1, nsteps=1, send=True)
    s.send_step(f, 0)
    s.stop(f)
    s.stop(op)
    s.flush()
    r = run(s, tmp_path, env={"RANK": "13", "LOCAL_RANK": "5"})
    assert r.header is not None
    assert (r.header.rank, r.header.local_rank, r.header.version) == (13, 5, 4)
    at_init, at_first_op = r.of(Comm)  # channels are known from the first op
    assert r.records[0] == at_init
    assert (at_init.comm, at_init.nranks, at_init.comm_rank) == (HASH, 4, 1)
    assert (at_init.nchannels, at_first_op.nchannels) == (0, 2)
    assert at_first_op == Comm(at_first_op.ts_ns, HASH, 4, 1, 2, -1)  # no CUDA here
    n = _one(r.of(CommName))
    assert isinstance(n, CommName) and n.text == "world"
    i = _one(r.of(OpIssued))
    assert isinstance(i, OpIssued)
    assert (i.comm, i.seq, i.func_seq, i.nbytes) == (HASH, 0, 11, 6000)
    assert vocab.OP_NAMES[i.kind] == "reducescatter"
    assert (vocab.ALGORITHMS[i.algo], vocab.PROTOCOLS[i.proto]) == ("tree", "ll128")
    assert i.dtype == 4  # bfloat16
    order = [type(x) for x in r.records]
    assert order.index(OpIssued) < order.index(FlowProgress) < order.index(FlowDone)
    assert order.index(FlowDone) < order.index(OpDone)


def test_ring_rank_falls_back_to_first_communicator(tmp_path: Path) -> None:
    s = Script()
    _world(s, rank=3)
    s.flush()
    r = run(s, tmp_path)
    assert r.header is not None and r.header.rank == 3
    assert r.header.pid > 0 and r.header.pid != os.getpid()


def test_op_done_waits_for_enqueue_and_every_flow(tmp_path: Path) -> None:
    s = Script()
    _world(s)
    op = s.coll(0, seq=4, count=1024, nch=2)
    a = s.proxyop(op, channel=0, peer=1, nsteps=1, send=True)
    b = s.proxyop(op, channel=1, peer=1, nsteps=1, send=True)
    s.send_step(a, 0)
    s.send_step(b, 0)
    s.stop(a)
    s.flush()
    s.stop(b)
    s.flush()  # both flows done, Coll not yet stopped (enqueue not finished)
    s.lines.append("# marker")
    s.stop(op)
    s.flush()
    r = run(s, tmp_path)
    assert len(r.of(FlowDone)) == 2
    end = _one(r.of(OpDone))
    assert isinstance(end, OpDone) and end.nflows == 2
    assert r.records.index(end) > max(r.records.index(x) for x in r.of(FlowDone))


def test_a_late_channel_is_not_cut_off(tmp_path: Path) -> None:
    """NCCL stops Coll at enqueue; a channel's ProxyOp may start after another ended."""
    s = Script()
    _world(s)
    op = s.coll(0, seq=8, count=1024, nch=2)
    s.stop(op)
    a = s.proxyop(op, channel=0, peer=1, nsteps=1, send=True)
    s.send_step(a, 0)
    s.stop(a)
    s.tick()  # channel 0 retired; the op looks complete for the first time
    b = s.proxyop(op, channel=1, peer=1, nsteps=1, send=True)
    s.send_step(b, 0)
    s.stop(b)
    s.tick()
    s.tick()  # two quiet ticks: done
    s.lines.append("fin 0")
    r = run(s, tmp_path)
    end = _one(r.of(OpDone))
    assert end.nflows == 2
    assert {f.channel for f in r.of(FlowDone)} == {0, 1}
    assert r.of(Beat)[-1].dropped_flows == 0


def test_kernel_channels_time_an_intra_node_op(tmp_path: Path) -> None:
    """NVLink/SHM ops have only KernelCh events: OP_DONE, no flow records."""
    s = Script()
    _world(s)
    op = s.coll(0, seq=5, count=1 << 16, nch=2)
    k0, k1 = s.kch(op, 0), s.kch(op, 1)
    s.stop(op)
    s.state(k0, KERNEL_CH_STOP)
    s.stop(k0)
    s.flush()  # channel 1 still running: no OP_DONE yet
    s.lines.append("# first flush above")
    s.stop(k1)
    s.flush()
    r = run(s, tmp_path)
    assert r.of(FlowProgress) == [] and r.of(FlowDone) == []
    end = _one(r.of(OpDone))
    assert isinstance(end, OpDone)
    assert (end.seq, end.nflows) == (0, 0)
    assert 0 < end.start_ns <= end.ts_ns
    beats = r.of(Beat)
    assert r.records.index(end) > r.records.index(beats[0])  # after the first tick


def test_pool_exhaustion_is_counted_in_the_beat(tmp_path: Path) -> None:
    s = Script()
    s.init(0, HASH, 4, 1, 2, "world")
    s.init(1, HASH + 1, 2, 0, 1, "tp")  # no communicator slot left
    ops = [s.coll(0, seq=i, count=1024, nch=1) for i in range(3)]  # 2 ops fit
    flows = [
        s.proxyop(ops[0], channel=c, peer=1, nsteps=1, send=True) for c in range(5)
    ]
    for f in flows:
        s.send_step(f, 0)
    s.flush()
    r = run(
        s,
        tmp_path,
        env={
            "MYCROFT_NCCL_COMMS": "1",
            "MYCROFT_NCCL_OPS": "2",
            "MYCROFT_NCCL_FLOWS": "3",
        },
    )
    # a full pool declines the communicator (no context), never an error
    assert r.stdout.splitlines()[:2] == ["init 0 mask 94", "init 0 mask 0"]
    beat = r.of(Beat)[-1]
    assert isinstance(beat, Beat)
    assert (beat.dropped_comms, beat.dropped_ops, beat.dropped_flows) == (1, 1, 2)
    assert beat.pxn_flows == 0
    assert len({(x.channel) for x in r.of(FlowProgress)}) == 3
    # the harness saw NULL handles for the dropped op and flows, and their children
    assert r.stdout.splitlines()[-1] == f"nulls {1 + 2 + 2}"


def test_pxn_flows_are_counted_not_attributed(tmp_path: Path) -> None:
    """A proxy op run for another process: its parent pointer is never dereferenced."""
    s = Script()
    _world(s)
    op = s.coll(0, seq=6, count=1024, nch=1)
    local = s.proxyop(op, channel=0, peer=1, nsteps=2, send=True)
    other = s.proxyop(op, channel=4, peer=9, nsteps=2, send=True, pid=1)
    for i in range(2):
        s.send_step(local, i)
        s.send_step(other, i)
    s.stop(other)
    s.stop(local)
    s.stop(op)
    s.flush()
    r = run(s, tmp_path)
    assert {x.channel for x in r.of(FlowProgress)} == {0}
    beat = r.of(Beat)[-1]
    assert isinstance(beat, Beat) and beat.pxn_flows == 1
    end = _one(r.of(OpDone))
    assert isinstance(end, OpDone) and end.nflows == 1


def test_several_communicators_keep_their_ops_apart(tmp_path: Path) -> None:
    s = Script()
    hashes = [HASH + 100 * i for i in range(3)]
    for cid, h in enumerate(hashes):
        s.init(cid, h, 8, cid, 2, ["world", "dp", "tp"][cid])
    for cid in range(3):
        for seq in range(2):
            op = s.coll(cid, seq=seq, count=256 * (cid + 1), nch=1)
            f = s.proxyop(op, channel=cid, peer=cid + 1, nsteps=seq + 1, send=True)
            for i in range(seq + 1):
                s.send_step(f, i)
            s.stop(f)
            s.stop(op)
    s.flush()
    r = run(s, tmp_path)
    comms = {x.comm: x for x in r.of(Comm)}
    assert set(comms) == set(hashes)
    assert [comms[h].comm_rank for h in hashes] == [0, 1, 2]
    names = {x.comm: x.text for x in r.of(CommName)}
    assert names == dict(zip(hashes, ["world", "dp", "tp"], strict=True))
    dones = {(x.comm, x.seq): x for x in r.of(FlowDone)}
    for cid, h in enumerate(hashes):
        for seq in range(2):
            d = dones[(h, seq)]
            assert (d.channel, d.peer, d.chunks) == (cid, cid + 1, seq + 1)
    issued = {(x.comm, x.seq): x.nbytes for x in r.of(OpIssued)}
    assert issued[(hashes[2], 1)] == 3 * 256 * 4
    assert len(r.of(OpDone)) == 6


def test_32_channels_each_direction(tmp_path: Path) -> None:
    s = Script()
    _world(s)
    op = s.coll(0, seq=9, count=1 << 24, nch=32)
    flows = []
    for c in range(32):
        n = c % 8 + 1
        flows.append((s.proxyop(op, c, (c + 1) % 4, n, True), n))
        flows.append((s.proxyop(op, c, (c + 3) % 4, n, False), n))
    for k, (f, n) in enumerate(flows):
        for i in range(n):
            if k % 2 == 0:
                s.send_step(f, i, upto=4 if i else 3, nbytes=c_bytes(k))
            else:
                s.recv_step(f, i, upto=4 if i else 2, nbytes=c_bytes(k))
    s.flush()
    r = run(s, tmp_path)
    assert r.corrupt == 0
    for c in range(32):
        n = c % 8 + 1
        snd, rcv = _one(_progress(r.records, c, 0)), _one(_progress(r.records, c, 1))
        assert isinstance(snd, FlowProgress) and isinstance(rcv, FlowProgress)
        assert (snd.peer, rcv.peer) == ((c + 1) % 4, (c + 3) % 4)
        # step 0 stops short: send at SendWait, recv at RecvFlushWait
        assert (snd.total, snd.gpu_ready, snd.transmitted, snd.done) == (n, n, n, n - 1)
        assert (rcv.total, rcv.gpu_ready, rcv.transmitted, rcv.done) == (
            n,
            n,
            n - 1,
            n - 1,
        )
        rs = _one(_steps(r.records, c, 1))
        assert isinstance(rs, FlowSteps)
        assert (rs.received, rs.nbytes) == (n, n * c_bytes(2 * c + 1))


def c_bytes(k: int) -> int:
    """Distinct per-flow step sizes for the 32-channel test."""
    return 4096 + k


def test_p2p_uses_a_two_member_virtual_communicator(tmp_path: Path) -> None:
    s = Script()
    _world(s, rank=1)
    snd = s.p2p(0, "Send", peer=3, count=100)
    rcv = s.p2p(0, "Recv", peer=0, count=100)
    for op, peer, send in ((snd, 3, True), (rcv, 0, False)):
        f = s.proxyop(op, channel=0, peer=peer, nsteps=1, send=send)
        (s.send_step if send else s.recv_step)(f, 0)
        s.stop(f)
        s.stop(op)
    s.flush()
    r = run(s, tmp_path)
    comms = [c for c in r.of(Comm) if c.comm != HASH]
    assert sorted((c.nranks, c.comm_rank) for c in comms) == [(2, 0), (2, 1)]
    issued = r.of(OpIssued)
    kinds = {vocab.OP_NAMES[i.kind] for i in issued}
    assert kinds == {"send", "recv"}
    assert all(i.seq == 0 and i.nbytes == 400 for i in issued)
    assert {c.comm for c in comms} == {i.comm for i in issued}
    assert HASH not in {i.comm for i in issued}
    assert len(r.of(OpDone)) == 2


def test_progress_invariants_hold_in_every_snapshot(tmp_path: Path) -> None:
    s = Script()
    _world(s)
    op = s.coll(0, seq=0, count=1 << 20, nch=2)
    a = s.proxyop(op, 0, 1, 6, True)
    b = s.proxyop(op, 1, 2, 6, False)
    for i in range(6):
        s.send_step(a, i, upto=(i * 7) % 5)
        s.recv_step(b, i, upto=(i * 3) % 5)
        s.flush()
    r = run(s, tmp_path)
    snaps = r.of(FlowProgress)
    assert len(snaps) >= 6
    for p in snaps:
        assert isinstance(p, FlowProgress)
        assert p.total >= p.gpu_ready >= p.transmitted >= p.done >= 0, p


def test_agent_reader_skips_flow_steps(tmp_path: Path) -> None:
    s = Script()
    _world(s)
    op = s.coll(0, seq=0, count=1024, nch=1)
    f = s.proxyop(op, 0, 1, 1, True)
    s.send_step(f, 0)
    s.flush()
    r = run(s, tmp_path)
    assert len(r.of(FlowSteps)) == 1
    ring = next(tmp_path.glob("ring-*/*.ring"))
    reader = RingReader(ring)
    try:
        got = reader.poll()
    finally:
        reader.close()
    assert not any(isinstance(x, FlowSteps) for x in got)
    assert len(got) == len(r.records) - 1 and reader.corrupt == 0


def test_init_failure_disables_with_one_log_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    s = Script()
    _world(s)
    s.init(1, HASH + 1, 2, 0, 1, "tp")
    op = s.coll(0, seq=0, count=1024, nch=1)
    s.stop(op)
    s.flush()
    r = run(s, tmp_path, env={"MYCROFT_NCCL_RING_DIR": str(blocker / "sub")})
    # declined with success and an empty mask: NCCL keeps its loader reference
    assert r.stdout.splitlines()[:2] == ["init 0 mask 0", "init 0 mask 0"]
    warn = [line for line in r.stderr.splitlines() if "Mycroft" in line]
    assert len(warn) == 1 and "MYCROFT_NCCL_RING_DIR" in warn[0]


def test_bad_pool_size_disables(tmp_path: Path) -> None:
    s = Script()
    _world(s)
    r = run(s, tmp_path, env={"MYCROFT_NCCL_OPS": "lots"})
    assert r.stdout.startswith("init 0 mask 0")
    assert "MYCROFT_NCCL_" in r.stderr and r.rings == 0


def test_flows_name_the_peer_as_ncclproxy_gives_it(tmp_path: Path) -> None:
    """ProxyOp ``peer`` is the rank within the communicator, written unchanged."""
    s = Script()
    s.init(0, HASH, 4, 2, 2, "tp")
    op = s.coll(0, seq=0, count=1024, nch=1)
    f = s.proxyop(op, channel=0, peer=3, nsteps=1, send=True)
    s.send_step(f, 0)
    s.flush()
    r = run(s, tmp_path, env={"RANK": "10"})
    assert r.header is not None and r.header.rank == 10
    assert _one(r.of(FlowProgress)).peer == 3


def test_a_child_forked_after_init_does_not_write_the_parents_ring(
    tmp_path: Path,
) -> None:
    s = Script()
    _world(s)
    s.lines.append("forkinit")
    s.flush()
    r = run(s, tmp_path)
    assert "child init 0 mask 0" in r.stdout
    assert "forked after the first init" in r.stderr
    assert 0xC41D not in {c.comm for c in r.of(Comm)} and r.rings == 1


def test_the_tick_thread_survives_nccls_dlclose(tmp_path: Path) -> None:
    """NCCL dlcloses the plugin after the last communicator's finalize; the tick
    thread is still running then, so the library must stay mapped."""
    s = Script()
    _world(s)
    s.lines.append("fin 0")
    s.lines.append("dlclose")
    s.sleep(300)  # 30 ticks of 10 ms after the close
    r = run(s, tmp_path, env={"MYCROFT_NCCL_TICK_MS": "10"})
    assert r.stdout.splitlines()[-1] == "nulls 0"
    assert len(r.of(Beat)) >= 1
