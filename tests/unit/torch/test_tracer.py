"""The live tracer in one process (gloo, world of 1) and ring layout version 2."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mycroft.producers import ring_layout as L
from mycroft.producers.agent.aggregate import Aggregator
from mycroft.producers.ring import RingReader, RingWriter
from mycroft.producers.torch import settings_from_env
from mycroft.producers.torch.tracer import comm_hash
from mycroft.schemas.vocab import OP_NAMES


def test_comm_ranks_and_name_round_trip(tmp_path: Path) -> None:
    ranks = tuple(range(0, 26, 2))  # 13 members: three records
    with RingWriter(tmp_path / "a.ring", rank=0, nslots=64, version=2) as w:
        for rec in L.comm_ranks_records(5, 99, ranks):
            w.write(rec)
        w.write(L.comm_name_record(5, 99, "dp-replicas"))
        w.op_issued(6, 99, 0, 128, OP_NAMES.index("allreduce"), 1)
        w.op_done(7, 99, 0, 6)
        r = RingReader(w.path)
        got = r.poll()
    assert r.header.version == 2 and r.corrupt == 0
    agg = Aggregator()
    agg.add_rank("a", 0, 1)
    for rec in got:
        agg.apply("a", rec)
    cs = agg.ranks["a"].comms[99]
    assert cs.ranks == ranks and cs.name == "dp-replicas"
    issued = [x for x in got if isinstance(x, L.OpIssued)][0]
    assert (issued.nbytes, issued.dtype, issued.kind) == (128, 1, 0)
    assert agg.tick().done_op["end_ns"].tolist() == [7]


def test_version_1_stays_default_and_readable(tmp_path: Path) -> None:
    with RingWriter(tmp_path / "b.ring", rank=1, nslots=8) as w:
        w.write(L.Beat(1, -1))
        assert RingReader(w.path).header.version == 1
    with pytest.raises(ValueError, match="version"):
        RingWriter(tmp_path / "c.ring", rank=1, nslots=8, version=L.VERSION_MAX + 1)


def test_comm_hash_is_stable() -> None:
    assert comm_hash("0") == comm_hash("0") != comm_hash("1")
    assert comm_hash("0") == 0x57DBA2626F992FAC  # every rank and the FR import agree


def test_settings_from_env() -> None:
    got = settings_from_env({"MYCROFT_TORCH_BEAT_S": "0.5", "MYCROFT_RING_DIR": "/x"})
    assert got == {"ring_dir": "/x", "beat_s": 0.5, "keep_ring": False}
    got = settings_from_env({"MYCROFT_TORCH_FR": "0", "MYCROFT_TORCH_FR_POLL_S": "2"})
    assert got["flight_recorder"] is False and got["fr_poll_s"] == 2.0
    with pytest.raises(ValueError, match="MYCROFT_TORCH_RING_SLOTS"):
        settings_from_env({"MYCROFT_TORCH_RING_SLOTS": "many"})


@pytest.fixture
def world1(tmp_path: Path) -> Iterator[Any]:
    dist = pytest.importorskip("torch.distributed")
    from mycroft.producers import torch as mt  # noqa: PLC0415

    tracer = mt.install(ring_dir=tmp_path / "rings", beat_s=0.02, keep_ring=True)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        yield dist, tracer
    finally:
        dist.destroy_process_group()
        mt.uninstall()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_traced_ops_reach_the_ring(world1: Any, tmp_path: Path) -> None:
    import torch  # noqa: PLC0415

    dist, tracer = world1
    t = torch.ones(16)
    dist.all_reduce(t)
    sub = dist.new_group([0], group_desc="tp")
    work = dist.all_reduce(torch.ones(4, dtype=torch.float64), group=sub, async_op=True)
    work.wait()
    dist.broadcast(t, src=0)
    dist.barrier()
    import time  # noqa: PLC0415

    time.sleep(0.1)
    (path,) = (tmp_path / "rings").glob("*.ring")
    recs = RingReader(path).poll()
    issued = [r for r in recs if isinstance(r, L.OpIssued)]
    done = [r for r in recs if isinstance(r, L.OpDone)]
    world, tp = comm_hash("0"), [r.comm for r in issued if r.dtype == 2][0]
    assert [(r.comm, r.seq, OP_NAMES[r.kind]) for r in issued if r.comm == world] == [
        (world, 0, "allreduce"),
        (world, 1, "broadcast"),
        (world, 2, "barrier"),
    ]
    assert [r.nbytes for r in issued if r.comm == tp] == [32]
    assert {(r.comm, r.seq) for r in done} == {(r.comm, r.seq) for r in issued}
    assert all(d.start_ns <= d.ts_ns for d in done)
    names = {r.comm: r.text for r in recs if isinstance(r, L.CommName)}
    assert names == {world: "world", tp: "tp"}
    assert any(isinstance(r, L.Beat) for r in recs) and tracer.stats.beats > 0
    assert os.getpid() == RingReader(path).header.pid


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_paused_ops_are_not_recorded_and_resume_goes_on(
    world1: Any, tmp_path: Path
) -> None:
    import torch  # noqa: PLC0415

    from mycroft.producers import torch as mt  # noqa: PLC0415

    dist, _tracer = world1
    t = torch.ones(8)
    dist.all_reduce(t)
    mt.pause()
    dist.all_reduce(t)
    dist.all_reduce(t)
    mt.resume()
    dist.all_reduce(t)
    (path,) = (tmp_path / "rings").glob("*.ring")
    issued = [r for r in RingReader(path).poll() if isinstance(r, L.OpIssued)]
    # numbers are torch's (Flight Recorder polled): the paused ops leave a gap
    assert [r.seq for r in issued if r.comm == comm_hash("0")] == [0, 3]
