"""A simulated ring-allreduce job, replayed as NCCL proxy events through the plugin.

The simulator's chunk model (``producers/sim``) gives each rank's per-flow
counters every 100 ms; ``sim_events`` turns them into the ProxyOp/ProxyStep
calls NCCL's proxy makes for them, the harness drives the plugin with those,
and the ring must hold the simulator's counters, op for op and flow for flow.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from mycroft.producers.ring_layout import FlowDone, FlowProgress, OpDone, OpIssued
from mycroft.producers.sim.config import Hardware, SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.records import CompletionBatch, Record
from tests.unit.nccl.harness import run
from tests.unit.nccl.sim_events import rank_script, sim_flows

FAULTY = 3


@functools.cache
def _job() -> tuple[Record, ...]:
    """16 ranks (tp 8 x dp 2, 2 hosts), 2 s; rank 3's NIC goes down at 1.2 s."""
    out = ListWriter()
    cfg = SimConfig(  # slots: a send is posted only into a slot the receiver freed
        tp=8, pp=1, dp=2, duration_s=2.0, seed=11, hardware=Hardware(counters="slots")
    )
    simulate(cfg, [parse_spec(f"nic-down:rank={FAULTY},at=1.2")], out)
    return tuple(rec for _, rec in out.records)


@pytest.mark.parametrize("rank", [0, FAULTY, 11])
def test_ring_holds_the_simulated_counters(tmp_path: Path, rank: int) -> None:
    records = _job()
    r = run(rank_script(records, rank), tmp_path, env={"RANK": str(rank)})
    assert r.corrupt == 0 and r.header is not None and r.header.rank == rank
    # the plugin numbers ops itself; NCCL's seqNumber (the script's) is func_seq
    ident = {(i.comm, i.seq): (i.comm, i.func_seq) for i in r.of(OpIssued)}
    got: dict[tuple[int, int, int, int, int], list[tuple[int, int, int, int]]] = {}
    for p in r.of(FlowProgress):
        key = (*ident[(p.comm, p.seq)], p.channel, p.direction, p.peer)
        got.setdefault(key, []).append((p.total, p.gpu_ready, p.transmitted, p.done))
    want = sim_flows(records, rank)
    assert len(want) > 50
    assert got == want
    done = {
        (int(o["comm"]), int(o["seq"]))
        for b in records
        if isinstance(b, CompletionBatch)
        for o in b.op
        if int(o["rank"]) == rank
    }
    assert {ident[(d.comm, d.seq)] for d in r.of(OpDone)} == done
    assert len(r.of(FlowDone)) == sum(
        1 for k, v in want.items() if (k[0], k[1]) in done
    )
    issued = set(ident.values())
    assert done < issued or rank == 0  # the NIC fault leaves ops in flight


def test_the_faulty_ranks_stuck_flow_is_in_the_ring(tmp_path: Path) -> None:
    """After the NIC goes down, some flow of rank 3 stops with T < G or D < T."""
    r = run(rank_script(_job(), FAULTY), tmp_path)
    last: dict[tuple[int, int, int, int, int], FlowProgress] = {}
    for p in r.of(FlowProgress):
        last[(p.comm, p.seq, p.channel, p.direction, p.peer)] = p
    done = {(d.comm, d.seq) for d in r.of(OpDone)}
    stuck = [p for k, p in last.items() if (k[0], k[1]) not in done]
    assert stuck
    assert any(p.done < p.total for p in stuck)
