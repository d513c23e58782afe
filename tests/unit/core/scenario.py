"""A tiny scripted job for core tests: 8 ranks, 4 hosts, TP pairs + DP rings.

Each iteration: rank compute, TP allreduce in its host pair, DP ring allreduce
across hosts (2 channels). State batches every 100 ms per host; completion
batches per tick; a fault changes the schedule or the flow counters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from mycroft.schemas.columns import (
    DONE_FLOW_COLUMNS,
    DONE_OP_COLUMNS,
    FLOW_COLUMNS,
    OP_COLUMNS,
    RC_COLUMNS,
    empty,
)
from mycroft.schemas.records import (
    BatchHeader,
    ChannelTopology,
    CommMembership,
    CompletionBatch,
    RankTopology,
    Record,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.schemas.vocab import OP_NAMES, RECV, SEND
from mycroft.streams.core.engine import Analyzer

JOB = "job1"
NR, PER_HOST, TICK = 8, 2, 100_000_000
T0 = 1_700_000_000_000_000_000
TP = {h: 0x100 + h for h in range(NR // PER_HOST)}
DP = {i: 0x200 + i for i in range(PER_HOST)}
CHUNKS = 16
MS = 1_000_000


def host_of(r: int) -> int:
    return r // PER_HOST


def struck(fault: Fault) -> set[int]:
    """Ranks a fault hits: every rank of the host for ``network``
    (background traffic on all its NICs, the paper's case 6), else the
    fault's rank."""
    if fault.kind == "network":
        return {r for r in range(NR) if host_of(r) == host_of(fault.rank)}
    return {fault.rank}


def comm_members(comm: int) -> list[int]:
    if comm >= 0x200:
        return [r for r in range(NR) if r % PER_HOST == comm - 0x200]
    return [r for r in range(NR) if host_of(r) == comm - 0x100]


@dataclass
class Fault:
    kind: str = "none"
    rank: int = 3
    at_s: float = 6.0
    factor: float = 2.5
    mismatch_bytes: int = 0


@dataclass
class Op:
    comm: int
    seq: int
    kind: int
    nbytes: int
    issue: dict[int, int]
    start: int
    end: dict[int, int]
    dur: int


@dataclass
class Job:
    fault: Fault = field(default_factory=Fault)
    seconds: float = 12.0
    seed: int = 1
    slow_rank: int = -1  # consistently slow but healthy
    bubble_ms: int = 0  # extra idle gap for every rank between iterations
    ops: list[Op] = field(default_factory=list)
    hang_at: int = -1

    def schedule(self) -> None:
        rnd = random.Random(self.seed)
        f, t, seq = self.fault, T0 + 50 * MS, 0
        f_ns = T0 + int(f.at_s * 1e9)
        while t < T0 + self.seconds * 1e9:
            comp = {r: int((80 + rnd.uniform(-4, 4)) * MS) for r in range(NR)}
            if self.slow_rank >= 0:
                comp[self.slow_rank] += 30 * MS
            if f.kind == "gpu-power-cap" and t >= f_ns:
                comp[f.rank] = int(comp[f.rank] * f.factor)
            tp_end = {}
            for c in TP.values():
                mem = comm_members(c)
                issue = {r: t + comp[r] for r in mem}
                tp_end.update(self._op(c, seq, issue, 10 * MS, t, f_ns))
            for c in DP.values():
                mem = comm_members(c)
                self._op(c, seq, {r: tp_end[r] for r in mem}, 60 * MS, t, f_ns)
            t = max(max(o.end.values()) for o in self.ops[-len(TP) - len(DP) :])
            t += (self.bubble_ms + rnd.randint(0, 3)) * MS
            seq += 1

    def _op(
        self, comm: int, seq: int, issue: dict[int, int], dur: int, t: int, f_ns: int
    ) -> dict[int, int]:
        f = self.fault
        kind, nbytes = OP_NAMES.index("allreduce"), 1 << 20
        active = t >= f_ns and bool(struck(f) & issue.keys())
        if active and comm >= 0x200 and f.kind in ("nic-bandwidth", "network", "pcie"):
            dur = int(dur * f.factor)
        start = max(issue.values())
        end = {r: start + dur for r in issue}
        if active and f.kind == "pcie" and comm >= 0x200:
            end[f.rank] += 8 * MS
        self.ops.append(Op(comm, seq, kind, nbytes, issue, start, end, dur))
        return end


def topology() -> list[Topology]:
    out = []
    for h in range(NR // PER_HOST):
        ranks = []
        for r in range(h * PER_HOST, (h + 1) * PER_HOST):
            comms = []
            for c in (TP[h], DP[r % PER_HOST]):
                mem = comm_members(c)
                i = mem.index(r)
                nxt, prv = mem[(i + 1) % len(mem)], mem[(i - 1) % len(mem)]
                chans = tuple(ChannelTopology(ch, prv, nxt, -1) for ch in range(2))
                name = "tp" if c < 0x200 else "dp"
                comms.append(CommMembership(c, name, len(mem), i, tuple(mem), chans))
            ranks.append(
                RankTopology(
                    r,
                    r % PER_HOST,
                    f"gpu{r % PER_HOST}",
                    f"mlx5_{r % PER_HOST}",
                    tuple(comms),
                )
            )
        out.append(Topology(JOB, f"h{h}", f"10.0.0.{h}", T0, tuple(ranks)))
    return out


class Emitter:
    """Turns the schedule (and the fault) into per-host batches per tick."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.f = job.fault
        self.f_ns = T0 + int(self.f.at_s * 1e9)
        if self.f.kind in ("gpu-hang", "nic-down"):  # strike mid DP op
            op = next(
                o
                for o in job.ops
                if o.comm >= 0x200 and self.f.rank in o.issue and o.start >= self.f_ns
            )
            self.f_ns = op.start + op.dur // 2
        self.seq_no = {h: 0 for h in range(NR // PER_HOST)}
        self.hung = self.f.kind in ("gpu-hang", "nic-down", "process-crash", "mismatch")

    def alive_op(self, op: Op) -> bool:
        """Ops that start after a hang never happen."""
        if self.f.kind == "host-stall":
            others = [i for r, i in op.issue.items() if r != self.f.rank]
            return min(others) < self.f_ns + 300 * MS
        return not self.hung or min(op.issue.values()) < self.f_ns

    def frozen(self, op: Op, t: int) -> bool:
        return (
            self.hung
            and t >= self.f_ns
            and op.start <= self.f_ns + 0
            and max(op.end.values()) > self.f_ns
        )

    def issue_of(self, op: Op, r: int) -> int | None:
        i = op.issue[r]
        if self.f.kind == "host-stall" and r == self.f.rank and i >= self.f_ns:
            return None
        if self.hung and i >= self.f_ns and self.f.kind != "host-stall":
            return None
        if self.f.kind == "host-stall" and i >= self.f_ns:
            return i  # peers still issue and wait
        return i

    def records(self) -> list[tuple[int, Record]]:
        out: list[tuple[int, Record]] = [(T0, t) for t in topology()]
        t = T0 + TICK
        while t < T0 + self.job.seconds * 1e9:
            for h in range(NR // PER_HOST):
                out.extend(self._host_tick(h, t))
            t += TICK
        return out

    def _host_tick(self, h: int, t: int) -> list[tuple[int, Record]]:
        ranks = [r for r in range(NR) if host_of(r) == h]
        if self.f.kind == "process-crash" and t >= self.f_ns:
            ranks = [r for r in ranks if r != self.f.rank]
        rc, ops, flows, done_ops = [], [], [], []
        for r in ranks:
            for c in (TP[h], DP[r % PER_HOST]):
                issued, done, seen = -1, -1, t - 1 * MS
                for op in self.job.ops:
                    if op.comm != c or not self.alive_op(op):
                        continue
                    i = self.issue_of(op, r)
                    if i is None or i > t:
                        continue
                    issued = op.seq
                    end = op.end[r]
                    if (
                        self.f.kind == "host-stall"
                        and t >= self.f_ns
                        and any(self.issue_of(op, m) is None for m in op.issue)
                    ):
                        end = 1 << 62
                    elif self.frozen(op, t) or (
                        self.hung and end > self.f_ns and op.start > self.f_ns
                    ):
                        end = 1 << 62
                    if end <= t:
                        done = op.seq
                        if end > t - TICK:
                            done_ops.append((r, op, end))
                    else:
                        o, fl = self._in_flight(r, op, t, i)
                        ops.append(o)
                        flows.extend(fl)
                rc.append((r, c, issued, done, seen))
        return self._batches(h, t, rc, ops, flows, done_ops)

    def _progress(self, r: int, op: Op, t: int) -> tuple[float, int]:
        stop = t
        if self.hung and t >= self.f_ns:
            stop = self.f_ns + (0 if r == self.f.rank else 20 * MS)
        if op.start >= stop:
            return 0.0, 0
        p = min(1.0, max(0.0, (stop - op.start) / max(op.dur, 1)))
        return p, min(stop, op.start + op.dur)

    def _in_flight(self, r: int, op: Op, t: int, issue: int) -> tuple[tuple, list]:
        p, last = self._progress(r, op, t)
        if self.f.kind == "host-stall" and any(
            self.issue_of(op, m) is None for m in op.issue
        ):
            p, last = 0.0, 0
        mem = sorted(op.issue)
        i = mem.index(r)
        nxt, prv = mem[(i + 1) % len(mem)], mem[(i - 1) % len(mem)]
        if (
            self.f.kind == "mismatch"
            and r == self.f.rank
            and op.comm >= 0x200
            and issue >= self.f_ns - 200 * MS
        ):
            nbytes = op.nbytes * 2
        else:
            nbytes = op.nbytes
        flows = []
        struck_ranks = struck(self.f)
        active = (
            t >= self.f_ns and bool(struck_ranks & op.issue.keys()) and op.comm >= 0x200
        )
        for ch in range(2):
            base = int(p * CHUNKS)
            g, tr, d = min(CHUNKS, base + (1 if p > 0 else 0)), base, base
            fk = self.f.kind if active else ""
            if fk == "gpu-hang" and r == self.f.rank:
                g = tr = d = base
            if fk == "nic-down" and r == self.f.rank:
                g, tr, d = min(CHUNKS, base + 3), base, base
            if fk == "nic-down" and nxt == self.f.rank:
                tr, d = min(CHUNKS, base + 1), base
            if fk == "nic-bandwidth" and r == self.f.rank:
                g, tr, d = min(CHUNKS, base + 5), base, base
            if fk == "network" and r in struck_ranks:
                d = max(0, base - 5)
            if fk == "pcie" and r == self.f.rank:
                g = tr = d = int(base * 0.6)
            flows.append((ch, nxt, SEND, CHUNKS, g, tr, d, last if p > 0 else 0))
            rg = base + (3 if fk == "gpu-hang" and r == self.f.rank else 0)
            rg = min(CHUNKS, rg)
            # G = buffers posted (schemas/ring.md): every buffer once the
            # kernel runs, as NCCL without credits (the fluid model).
            posted = CHUNKS if p > 0 else 0
            flows.append((ch, prv, RECV, CHUNKS, posted, rg, rg, last if p > 0 else 0))
        op_row = (
            r,
            op.comm,
            op.seq,
            op.kind,
            1,
            1,
            nbytes,
            issue,
            _begin(op, r) if p > 0 else 0,
            len(flows),
        )
        return op_row, flows

    def _batches(self, h, t, rc, ops, flows, done_ops) -> list[tuple[int, Record]]:
        self.seq_no[h] += 1
        hdr = BatchHeader(JOB, f"h{h}", 1, self.seq_no[h], t, 100)
        sb = StateBatch(
            hdr, _arr(RC_COLUMNS, rc), _arr(OP_COLUMNS, ops), _arr(FLOW_COLUMNS, flows)
        )
        rows = [
            (r, op.comm, op.seq, op.kind, op.nbytes, op.issue[r], _begin(op, r), end, 0)
            for r, op, end in done_ops
        ]
        cb = CompletionBatch(
            BatchHeader(JOB, f"h{h}", 1, self.seq_no[h], t, 100),
            _arr(DONE_OP_COLUMNS, rows),
            empty(DONE_FLOW_COLUMNS),
        )
        return [(t, sb), (t, cb)]


def _begin(op: Op, r: int) -> int:
    """A rank's first progress: its kernel starts when it arrives (no CPU
    run-ahead in this script, so arrival is its issue) and moves its own step-0
    data at once; the ring as a whole only moves once every member is in."""
    return min(op.issue[r], op.start)


def _arr(group, rows) -> np.ndarray:
    """Rows as tuples; columns the tuple leaves out (optional ones) stay 0."""
    a = empty(group, len(rows))
    width = len(a.dtype.names or ())
    for i, row in enumerate(rows):
        a[i] = tuple(row) + (0,) * (width - len(row))
    return a


def make(kind: str = "none", rank: int = 3, seconds: float = 12.0, **kw) -> list:
    job = Job(Fault(kind, rank), seconds=seconds, **kw)
    job.schedule()
    return Emitter(job).records()


def full_batch(records, kind=StateBatch, host="h1", after_ns=T0 + 3 * 10**9):
    """A record of ``host`` with rows in every group, after ``after_ns``."""
    for ts, rec in records:
        if (
            isinstance(rec, kind)
            and rec.header.host == host
            and ts >= after_ns
            and len(rec.op)
            and (kind is CompletionBatch or (len(rec.rc) and len(rec.flow)))
        ):
            return ts, rec if kind is StateBatch else with_flows(rec)
    raise AssertionError("no such batch")


def with_flows(b):
    """A completion batch whose every op moved one chunk on one flow."""
    op = b.op.copy()
    op["nflows"] = 1
    flow = empty(DONE_FLOW_COLUMNS, len(op))
    flow["peer"] = op["rank"]  # a member of the op's comm
    flow["chunks"] = 4
    flow["first_ns"], flow["last_ns"] = op["start_ns"], op["end_ns"]
    return CompletionBatch(b.header, op, flow)


def run_analyzer(records, step_ns=100_000_000):
    """Feed ``records`` to a fresh analyzer, evaluating every ``step_ns`` of
    trace time and once past the end; return it and its findings."""
    an = Analyzer(JOB)
    out, nxt = [], T0
    for ts, rec in records:
        while nxt <= ts:
            out += an.evaluate(nxt)
            nxt += step_ns
        an.ingest(rec, ts)
    out += an.evaluate(nxt)
    return an, out


def best_culprit(out):
    """(rank, component, kind) of the first root cause's best culprit."""
    causes = [f for f in out if isinstance(f, RootCause)]
    assert causes, "no root cause"
    rc = causes[0]
    return rc.culprits[0].rank, rc.culprits[0].component, rc.kind
