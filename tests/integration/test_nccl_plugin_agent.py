"""NCCL plugin -> ring -> ``mycroft agent`` -> real Kafka (-> worker).

Two fake-NCCL processes (ranks 0 and 1, one communicator) drive the plugin in
real time with its tick thread on: 5 AllReduces complete, then in the 6th
rank 1's NIC stops after one transfer (GPU-ready 4, transmitted 1). One agent
drains both rings into Kafka; the test reads the batches back.

Then a simulated job with a NIC fault, its counters replayed as NCCL's proxy
events on 8 ranks of two hosts, one agent per host and a real worker: the
root cause names the rank and its NIC.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mycroft.kafka_client import DecodingConsumer, create_topics
from mycroft.producers.sim.config import Hardware, SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import (
    CompletionBatch,
    Record,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.streams.core.contract import Contract
from mycroft.streams.core.topology_contract import topology_problem
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.faust_topics import ensure_topics
from mycroft.streams.worker_process import WorkerProcess
from mycroft.topics import TopicSet
from tests.agent_process import stop_agent
from tests.unit.nccl.harness import Script, build
from tests.unit.nccl.sim_events import rank_script

pytestmark = pytest.mark.integration

COMM = 0x5EED
DONE_OPS = 5


def _rank_script(rank: int) -> Script:
    peer = 1 - rank
    s = Script()
    s.init(0, COMM, 2, rank, 2, "world")
    for seq in range(DONE_OPS + 1):
        op = s.coll(0, seq=seq, count=1 << 18, nch=1)
        snd = s.proxyop(op, channel=0, peer=peer, nsteps=4, send=True)
        rcv = s.proxyop(op, channel=0, peer=peer, nsteps=4, send=False)
        s.stop(op)  # enqueued
        stuck = seq == DONE_OPS
        for i in range(4):
            if stuck and rank == 1:  # the NIC stops after the first transfer
                s.send_step(snd, i, upto=4 if i == 0 else 2, nbytes=1 << 18)
            else:
                s.send_step(snd, i, upto=4, nbytes=1 << 18)
            s.recv_step(rcv, i, upto=4 if not stuck or i == 0 else 1, nbytes=1 << 18)
        if not stuck:
            s.stop(snd)
            s.stop(rcv)
        s.sleep(60)
    s.sleep(3000)  # the hang, as the agent samples it
    return s


@pytest.fixture(scope="module")
def shipped(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, list[Any]]]:
    """Run the job and one agent; every record the agent shipped, by type."""
    tmp = tmp_path_factory.mktemp("nccl-e2e")
    build_dir, ring_dir = build(), tmp / "rings"
    name = f"ncclagent.{uuid.uuid4().hex[:12]}"  # module-wide: one job, one agent
    prefix = name + "."
    topics = TopicSet(prefix, partitions=1)
    create_topics(kafka_bootstrap, topics)
    log = tmp / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "mycroft", "agent", "--source", "ring",
             "--ring-dir", str(ring_dir), "--host", "gpu0", "--job-id", "job-n",
             "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix,
             "--partitions", "1", "--spool-dir", str(tmp / "spool"),
             "--metrics-port", "0", "--nic-sysfs", ""],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            ranks = [_run_rank(build_dir, ring_dir, tmp, r) for r in (0, 1)]
            for proc in ranks:
                assert proc.wait(60) == 0
            time.sleep(1.0)
        finally:
            assert stop_agent(agent, log) == 0, log.read_text()
    yield _consume(kafka_bootstrap, name + ".g", topics)


def _run_rank(
    build_dir: Path, ring_dir: Path, tmp: Path, rank: int, job: Script | None = None
) -> subprocess.Popen[bytes]:
    """Start rank ``rank``'s fake-NCCL process on its script (all run at once)."""
    script = tmp / f"rank{rank}.script"
    script.write_text((job or _rank_script(rank)).text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYCROFT_")}
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), MYCROFT_NCCL_RING_DIR=str(ring_dir)
    )
    plugin = str(build_dir / "libnccl-profiler-mycroft.so")
    with script.open("rb") as stdin:
        return subprocess.Popen(
            [str(build_dir / "fake_nccl"), plugin, "6"],
            stdin=stdin, stdout=subprocess.DEVNULL, env=env,
        )  # fmt: skip


def _consume(bootstrap: str, group: str, topics: TopicSet) -> dict[str, list[Any]]:
    consumer = DecodingConsumer(
        bootstrap, group, [topics.state, topics.completion, topics.topology],
        topics.deadletter,
    )  # fmt: skip
    got: dict[str, list[Any]] = {"state": [], "completion": [], "topology": []}
    deadline, idle = time.monotonic() + 30, 0
    try:
        while time.monotonic() < deadline and idle < 6:
            batch = consumer.poll(timeout_s=0.5)
            idle = 0 if batch else idle + (1 if got["state"] else 0)
            for _, record in batch:
                if isinstance(record, StateBatch):
                    got["state"].append(record)
                elif isinstance(record, CompletionBatch):
                    got["completion"].append(record)
                elif isinstance(record, Topology):
                    got["topology"].append(record)
    finally:
        consumer.close()
    return got


def test_completed_ops_reach_kafka_with_their_flows(
    shipped: dict[str, list[Any]],
) -> None:
    ops = [row for b in shipped["completion"] for row in b.op]
    flows = [row for b in shipped["completion"] for row in b.flow]
    done = sorted((int(r["rank"]), int(r["seq"])) for r in ops if r["comm"] == COMM)
    assert done == [(r, s) for r in (0, 1) for s in range(DONE_OPS)]
    assert {int(r["nflows"]) for r in ops} == {2}
    assert {int(r["bytes"]) for r in ops} == {(1 << 18) * 4}
    assert len(flows) == 2 * len(ops)
    assert {int(f["chunks"]) for f in flows} == {4}
    assert all(0 < f["first_ns"] <= f["last_ns"] for f in flows)


def test_the_stuck_nic_shows_in_the_state(shipped: dict[str, list[Any]]) -> None:
    """Rank 1 sends: G 4, T 1; rank 0 receives from it: posted 4, T 1, D 1."""
    last: dict[tuple[int, int], tuple[int, int, int, int]] = {}
    for batch in shipped["state"]:
        i = 0
        for op in batch.op:
            for f in batch.flow[i : i + int(op["nflows"])]:
                if op["comm"] == COMM and op["seq"] == DONE_OPS:
                    key = (int(op["rank"]), int(f["dir"]))
                    last[key] = tuple(  # type: ignore[assignment]
                        int(f[c]) for c in ("total", "gpu_ready", "transmitted", "done")
                    )
            i += int(op["nflows"])
    assert last[(1, 0)] == (4, 4, 1, 1)
    assert last[(0, 1)] == (4, 4, 1, 1)
    assert last[(0, 0)] == (4, 4, 4, 4)  # rank 0's own send went out
    assert last[(1, 1)][2] == 1  # rank 1 received one step, rank 0 stalls on it


def test_topology_names_both_ranks_in_the_communicator(
    shipped: dict[str, list[Any]],
) -> None:
    topo = shipped["topology"][-1]
    got = {(rt.rank, m.comm, m.nranks, m.comm_rank, m.name) for rt in topo.ranks
           for m in rt.comms}  # fmt: skip
    assert got == {(0, COMM, 2, 0, "world"), (1, COMM, 2, 1, "world")}


def test_topology_passes_the_worker_contract(shipped: dict[str, list[Any]]) -> None:
    """Both members run on the host: the agent lists them in full."""
    topo = shipped["topology"][-1]
    assert topology_problem(topo, Contract()) is None
    assert {m.ranks for rt in topo.ranks for m in rt.comms} == {(0, 1)}


def test_flow_peers_are_global_ranks(shipped: dict[str, list[Any]]) -> None:
    peers = {
        (int(op["rank"]), int(f["peer"]))
        for b in shipped["completion"]
        for op, f in zip(np.repeat(b.op, b.op["nflows"]), b.flow, strict=True)
    }
    assert peers == {(0, 1), (1, 0)}


# -- a simulated job on two hosts, its NIC fault named by the worker ---------

FAULTY = 3
"""tp 4 x dp 2 on two hosts of 4 GPUs: the dp pairs (0, 4) ... (3, 7) cross
hosts, so each agent declares them in part and the worker joins them."""


def _sim_job() -> tuple[Record, ...]:
    out = ListWriter()
    cfg = SimConfig(
        tp=4, pp=1, dp=2, duration_s=7.0, seed=11,
        hardware=Hardware(gpus_per_host=4, gpus_per_nic=1),
    )  # fmt: skip
    simulate(cfg, [parse_spec(f"nic-down:rank={FAULTY},at=3.0")], out)
    return tuple(rec for _, rec in out.records)


def test_a_nic_fault_is_named_by_the_worker(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Plugin -> rings -> one agent per host -> Kafka -> worker: rank 3's NIC."""
    build_dir, records = build(), _sim_job()
    app = f"ncclrca.{uuid.uuid4().hex[:12]}"
    s = StreamSettings(
        kafka_bootstrap, app_id=app, prefix=app + ".", partitions=1,
        evaluate_interval_s=0.1, snapshot_interval_s=1.0,
        data_dir=str(tmp_path / "data"),
    )  # fmt: skip
    ensure_topics(s)
    worker = WorkerProcess(s, tmp_path / "worker.log")
    worker.start()
    agents = [_agent(kafka_bootstrap, s.prefix, tmp_path, h) for h in (0, 1)]
    try:
        ranks = [
            _run_rank(build_dir, tmp_path / f"rings{r // 4}", tmp_path, r,
                      _paced(records, r))
            for r in range(8)
        ]  # fmt: skip
        for proc in ranks:
            assert proc.wait(90) == 0
        causes = _root_causes(s, 40.0)
    finally:
        for agent, log in agents:
            assert stop_agent(agent, log) == 0, log.read_text()
        worker.stop()
    assert causes, worker.log()
    named = [(c.rank, c.component.value, c.peer, c.reason) for c in causes[-1].culprits]
    top = causes[-1].culprits[0]
    assert (top.rank, top.host, top.component.value) == (FAULTY, "gpu0", "nic"), named
    assert top.peer == FAULTY + 4  # its dp peer, a global rank (sent as position 1)
    assert "invalid." not in worker.log()  # every record passed the contract


def _paced(records: tuple[Record, ...], rank: int) -> Script:
    """``rank``'s events one 100 ms tick at a time, then 4 s more of the hang."""
    script = rank_script(records, rank, pace_ms=100)
    script.sleep(4000)
    return script


def _agent(
    bootstrap: str, prefix: str, tmp: Path, host: int
) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"agent{host}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mycroft", "agent", "--source", "ring",
             "--ring-dir", str(tmp / f"rings{host}"), "--host", f"gpu{host}",
             "--job-id", "job-sim", "--bootstrap", bootstrap,
             "--topic-prefix", prefix, "--partitions", "1",
             "--spool-dir", str(tmp / f"spool{host}"), "--metrics-port", "0",
             "--nic-sysfs", ""],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, log


def _root_causes(s: StreamSettings, timeout_s: float) -> list[RootCause]:
    """Root causes on the topic, once one came and 3 s passed without more."""
    consumer = DecodingConsumer(
        s.bootstrap, s.app_id + ".rc", [TopicSet(s.prefix, 1).rootcause],
        TopicSet(s.prefix, 1).deadletter,
    )  # fmt: skip
    got: list[RootCause] = []
    deadline, quiet = time.monotonic() + timeout_s, 0.0
    try:
        while time.monotonic() < deadline and quiet < 3.0:
            batch = consumer.poll(timeout_s=0.5)
            got += [r for _, r in batch if isinstance(r, RootCause)]
            quiet = 0.0 if batch or not got else quiet + 0.5
    finally:
        consumer.close()
    return got
