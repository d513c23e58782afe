"""The simulator's chunk model as the NCCL proxy events it stands for (no tests here).

``rank_script`` turns one rank's counters in a simulated job (``StateBatch``
flow rows per tick, ``CompletionBatch`` at completion) into the harness
script NCCL's proxy would have produced: per op a Coll start and stop
(enqueued), per flow a ProxyOp of ``total`` steps, and per step the states
that move G, T and D (send: SendGPUWait + SendPeerWait, SendWait, stop;
recv: RecvWait, RecvFlushWait + RecvGPUWait, stop). After every tick the
script flushes (or sleeps one tick, paced). ``sim_flows`` gives the
simulator's own sequence of counters per flow, to compare with the ring.
A flow's peer is, as NCCL's ProxyOp gives it, the peer's position in the
communicator (the simulator's global rank looked up in the comm's members).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mycroft.schemas import vocab
from mycroft.schemas.records import CompletionBatch, Record, StateBatch, Topology
from tests.unit.nccl.harness import (
    RECV_FLUSH_WAIT,
    RECV_GPU_WAIT,
    RECV_WAIT,
    SEND_GPU_WAIT,
    SEND_PEER_WAIT,
    SEND_WAIT,
    Script,
)

NCCL_FUNC = {
    "allreduce": "AllReduce",
    "allgather": "AllGather",
    "reducescatter": "ReduceScatter",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
}
NCCL_STEPS = 8
"""Steps in flight per flow: NCCL keeps step handles in ``pHandles[step % 8]``."""
FlowKey = tuple[int, int, int, int, int]
"""comm, seq, channel, dir, peer."""
Counters = tuple[int, int, int, int]
"""total, gpu_ready, transmitted, done."""


@dataclass
class _Flow:
    handle: int
    send: bool
    total: int
    g: int = 0
    t: int = 0
    d: int = 0
    steps: dict[int, int] = field(default_factory=dict)


@dataclass
class _Rank:
    rank: int
    script: Script = field(default_factory=Script)
    comms: dict[int, int] = field(default_factory=dict)  # comm -> harness cid
    ops: dict[tuple[int, int], int] = field(default_factory=dict)
    flows: dict[FlowKey, _Flow] = field(default_factory=dict)
    step_bytes: int = 1 << 19

    def op(self, comm: int, seq: int, kind: int, nbytes: int, nch: int) -> int:
        key = (comm, seq)
        if key not in self.ops:
            func = NCCL_FUNC[vocab.OP_NAMES[kind]]
            h = self.script.coll(self.comms[comm], seq, max(nbytes // 4, 1), nch, func)
            self.script.stop(h)  # NCCL stops Coll once the op is enqueued
            self.ops[key] = h
        return self.ops[key]

    def advance(self, key: FlowKey, op: int, want: Counters) -> None:
        total, g, t, d = want
        f = self.flows.get(key)
        if f is None:
            _, _, channel, direction, peer = key
            h = self.script.proxyop(op, channel, peer, total, direction == 0)
            f = self.flows[key] = _Flow(h, direction == 0, total)
        s = self.script
        # step by step, as the proxy moves them: never more than NCCL_STEPS in flight
        for i in range(f.d, g):
            if i >= f.g:
                if i - f.d >= NCCL_STEPS:
                    break  # the slot of step i - 8 is not free yet
                f.g = i + 1
                f.steps[i] = h = s.step(f.handle, i)
                s.state(h, SEND_GPU_WAIT if f.send else RECV_WAIT)
                if f.send:
                    s.state(h, SEND_PEER_WAIT)
            if f.t <= i < t:
                f.t = i + 1
                if f.send:
                    s.state(f.steps[i], SEND_WAIT, self.step_bytes)
                else:
                    s.state(f.steps[i], RECV_FLUSH_WAIT, self.step_bytes)
                    s.state(f.steps[i], RECV_GPU_WAIT)
            if i < d:
                f.d = i + 1
                s.stop(f.steps.pop(i))

    def finish(self, key: FlowKey) -> None:
        self.script.stop(self.flows.pop(key).handle)


def _rows(batch: StateBatch | CompletionBatch, rank: int) -> Iterable[tuple]:
    """(op row, its flow rows) of ``rank`` in ``batch``."""
    i = 0
    for op in batch.op:
        n = int(op["nflows"])
        if int(op["rank"]) == rank:
            yield op, batch.flow[i : i + n]
        i += n


def _members(records: Iterable[Record]) -> dict[int, tuple[int, ...]]:
    return {
        m.comm: m.ranks
        for rec in records if isinstance(rec, Topology)
        for rt in rec.ranks for m in rt.comms
    }  # fmt: skip


def rank_script(records: Iterable[Record], rank: int, pace_ms: int = 0) -> Script:
    """The harness script of ``rank``'s NCCL events (``pace_ms`` 0: flush per tick)."""
    records = tuple(records)
    members = _members(records)
    r = _Rank(rank)
    tick = -1
    for rec in records:
        if isinstance(rec, Topology):
            for rt in rec.ranks:
                if rt.rank == rank:
                    for m in rt.comms:
                        r.comms[m.comm] = cid = len(r.comms)
                        r.script.init(cid, m.comm, m.nranks, m.comm_rank, 1, m.name)
            continue
        if not isinstance(rec, StateBatch | CompletionBatch):
            continue
        if rec.header.tick_ns != tick and tick >= 0:
            r.script.sleep(pace_ms) if pace_ms else r.script.flush()
        tick = rec.header.tick_ns
        for op, flows in _rows(rec, rank):
            comm, seq = int(op["comm"]), int(op["seq"])
            nch = len({int(f["channel"]) for f in flows}) or 1
            h = r.op(comm, seq, int(op["kind"]), int(op["bytes"]), nch)
            for f in flows:
                peer = members[comm].index(int(f["peer"]))
                key = (comm, seq, int(f["channel"]), int(f["dir"]), peer)
                if isinstance(rec, StateBatch):
                    want = (int(f["total"]), int(f["gpu_ready"]),
                            int(f["transmitted"]), int(f["done"]))  # fmt: skip
                    r.advance(key, h, want)
                else:
                    n = int(f["chunks"])
                    r.advance(key, h, (n, n, n, n))
                    r.finish(key)
    r.script.flush()
    return r.script


def in_flight(c: Counters) -> Counters:
    """The counters as NCCL can show them: G at most NCCL_STEPS ahead of D.

    The simulator's chunk counters may run further ahead (a receiver that
    posted 128 chunks and consumed none); NCCL's proxy cannot, so the events
    and the ring hold G and T clamped to ``D + NCCL_STEPS``.
    """
    total, g, t, d = c
    g = min(g, d + NCCL_STEPS)
    return total, g, min(t, g), d


def sim_flows(records: Iterable[Record], rank: int) -> dict[FlowKey, list[Counters]]:
    """Per flow of ``rank`` (peer: its position), the distinct successive
    counters (``in_flight``)."""
    records = tuple(records)
    members = _members(records)
    out: dict[FlowKey, list[Counters]] = {}
    for rec in records:
        if not isinstance(rec, StateBatch | CompletionBatch):
            continue
        for op, flows in _rows(rec, rank):
            for f in flows:
                comm = int(op["comm"])
                key = (comm, int(op["seq"]), int(f["channel"]), int(f["dir"]),
                       members[comm].index(int(f["peer"])))  # fmt: skip
                if isinstance(rec, StateBatch):
                    c = (int(f["total"]), int(f["gpu_ready"]),
                         int(f["transmitted"]), int(f["done"]))  # fmt: skip
                else:
                    n = int(f["chunks"])
                    c = (n, n, n, n)
                c = in_flight(c)
                seq = out.setdefault(key, [])
                if not seq or seq[-1] != c:
                    seq.append(c)
    return out
