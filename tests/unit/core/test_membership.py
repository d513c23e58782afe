"""Communicator members joined from partial declarations of several hosts.

A host that knows only its own ranks' positions in a comm (the NCCL plugin)
declares it in part (``-1`` at the others) and sends that comm's flow peers
as positions; the worker joins the hosts' parts and maps the peers.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mycroft.schemas.records import (
    CommMembership,
    CompletionBatch,
    RankTopology,
    StateBatch,
    Topology,
)
from mycroft.streams.core.contract import Contract, Reason
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.membership import MembershipJoin, is_partial, resolved
from mycroft.streams.core.record_gate import RecordGate
from mycroft.streams.core.topology_contract import topology_problem
from tests.unit.core.scenario import T0, best_culprit, make, run_analyzer
from tests.unit.core.snapshot_roundtrip import roundtrip_engine

COMM = 0x77


def _topo(host: str, ranks: dict[int, int], nranks: int = 4, ts: int = T0) -> Topology:
    """``host`` runs ``ranks`` (global rank -> position in COMM), declared in part."""
    members = [-1] * nranks
    for r, pos in ranks.items():
        members[pos] = r
    return Topology("j", host, "", ts, tuple(
        RankTopology(r, i, "", "", (CommMembership(COMM, "dp", nranks, pos,
                                                    tuple(members)),))
        for i, (r, pos) in enumerate(sorted(ranks.items()))
    ))  # fmt: skip


def test_partial_declarations_pass_the_contract_and_conflicting_ones_do_not() -> None:
    assert topology_problem(_topo("a", {10: 0, 11: 1}), Contract()) is None
    bad = _topo("a", {10: 0})
    m = bad.ranks[0].comms[0]
    wrong = replace(m, ranks=(10, 10, -1, -1))
    bad = replace(bad, ranks=(replace(bad.ranks[0], comms=(wrong,)),))
    assert topology_problem(bad, Contract()) is not None


def test_members_complete_once_every_position_is_declared() -> None:
    join, full = MembershipJoin(), {}
    assert join.declare(_topo("a", {10: 0, 11: 1}), full) == []
    assert COMM not in full
    assert join.declare(_topo("b", {12: 3}), full) == []
    assert join.declare(_topo("c", {13: 2}), full) == [COMM]
    assert full[COMM] == (10, 11, 13, 12)
    assert [t.host for t in join.waiting_on([COMM], "c")] == ["a", "b"]
    filled = resolved(_topo("a", {10: 0, 11: 1}), full)
    assert {m.ranks for rt in filled.ranks for m in rt.comms} == {(10, 11, 13, 12)}
    assert not any(is_partial(m) for rt in filled.ranks for m in rt.comms)


def test_an_incomplete_comm_is_left_out_of_what_reaches_the_engine() -> None:
    out = resolved(_topo("a", {10: 0, 11: 1}), {})
    assert [rt.rank for rt in out.ranks] == [10, 11]
    assert all(rt.comms == () for rt in out.ranks)


@pytest.mark.parametrize(
    ("second", "why"),
    [
        ({12: 1}, "position 1 is rank 11 and rank 12"),
        ({11: 2}, "rank 11 is at positions 1 and 2"),
    ],
)
def test_conflicting_declarations_are_rejected_with_a_reason(
    second: dict[int, int], why: str
) -> None:
    gate = RecordGate()
    assert gate.admit(_topo("a", {10: 0, 11: 1}), T0)
    assert gate.admit(_topo("b", second), T0) == []
    (rej,) = gate.take()
    assert rej.reason is Reason.BAD_TOPOLOGY and why in rej.detail
    assert gate.counts[(Reason.BAD_TOPOLOGY.value, "undeclared")] == 1


def test_another_size_for_the_same_comm_conflicts() -> None:
    gate = RecordGate()
    gate.admit(_topo("a", {10: 0, 11: 1}), T0)
    assert gate.admit(_topo("b", {12: 2}, nranks=8), T0) == []
    assert "nranks 8, declared 4" in gate.take()[0].detail


def test_a_full_list_is_passed_on_unchanged() -> None:
    topo = Topology("j", "a", "", T0, (
        RankTopology(0, 0, "", "", (CommMembership(COMM, "tp", 2, 0, (0, 1)),)),
        RankTopology(1, 1, "", "", (CommMembership(COMM, "tp", 2, 1, (0, 1)),)),
    ))  # fmt: skip
    gate = RecordGate()
    assert gate.admit(topo, T0) == [topo]
    assert gate.topo.relative("a") == frozenset()


# -- the scripted job of tests/unit/core/scenario.py, sent as partial -------


def _positions(records: list) -> dict[int, tuple[int, ...]]:
    return {
        m.comm: m.ranks
        for _, r in records if isinstance(r, Topology)
        for rt in r.ranks for m in rt.comms
    }  # fmt: skip


def _as_plugin_sends(records: list) -> list:
    """``records`` as hosts that know only their own ranks' positions send
    them: comms spanning hosts declared in part, their flow peers positions."""
    members = _positions(records)
    spans: set[int] = set()
    out = []
    for t, rec in records:
        r = rec
        if isinstance(r, Topology):
            own = {rt.rank for rt in r.ranks}
            ranks = []
            for rt in r.ranks:
                comms = []
                for m in rt.comms:
                    part = tuple(x if x in own else -1 for x in m.ranks)
                    if -1 in part:
                        spans.add(m.comm)
                    comms.append(replace(m, ranks=part))
                ranks.append(replace(rt, comms=tuple(comms)))
            r = replace(r, ranks=tuple(ranks))
        elif isinstance(r, StateBatch | CompletionBatch):
            r = _relative_peers(r, members, spans)
        out.append((t, r))
    assert spans
    return out


def _relative_peers(b, members, spans):
    owner = np.repeat(np.arange(len(b.op)), b.op["nflows"])
    flow = b.flow.copy()
    for i, f in enumerate(flow):
        comm = int(b.op["comm"][owner[i]])
        if comm in spans:
            f["peer"] = members[comm].index(int(f["peer"]))
    if isinstance(b, StateBatch):
        return StateBatch(b.header, b.rc, b.op, flow)
    return CompletionBatch(b.header, b.op, flow)


@pytest.mark.parametrize("kind", ["nic-down", "gpu-hang"])
def test_the_job_sent_in_parts_names_the_same_root_cause(kind: str) -> None:
    records = make(kind, 3)
    an_full, full = run_analyzer(records)
    an, out = run_analyzer(_as_plugin_sends(records))
    assert not an.gate.counts, an.gate.counts
    assert best_culprit(out) == best_culprit(full)
    assert an.ctx.topo.members(0x200) == an_full.ctx.topo.members(0x200)


def test_rows_wait_until_the_last_host_declares_its_part() -> None:
    """The last host's topology comes 1 s late: the others' rows of the
    comms it completes are held, then released with their peers mapped."""
    sent = _as_plugin_sends(make("nic-down", 3))
    first = next(t for t, r in sent if not isinstance(r, Topology))
    late = [(t, r) for t, r in sent if isinstance(r, Topology) and r.host == "h3"]
    rest = [(t, r) for t, r in sent if (t, r) not in late]
    at = first + 1_000_000_000
    moved = [(t, r) for t, r in rest if t < at]
    moved += [(at, replace(r, ts_ns=at)) for _, r in late]
    moved += [(t, r) for t, r in rest if t >= at]
    an, out = run_analyzer(moved)
    assert not an.gate.counts, an.gate.counts
    assert not an.gate.held
    assert best_culprit(out) == best_culprit(run_analyzer(make("nic-down", 3))[1])


def test_rows_of_a_comm_never_completed_are_held_then_rejected() -> None:
    sent = [(t, r) for t, r in _as_plugin_sends(make("nic-down", 3))
            if not (isinstance(r, Topology) and r.host == "h3")]  # fmt: skip
    an = Analyzer("job1")
    until = sent[0][0] + 8_000_000_000  # past the 5 s wait
    for t, r in (e for e in sent if e[0] < until):
        an.ingest(r, t)
        an.gate.expire(t)
    assert an.gate.counts[(Reason.UNKNOWN_RANK.value, "h0")] > 0
    assert 0x200 not in an.ctx.topo.comms
    assert an.gate.held
    assert all(b.header.tick_ns > until - 5_100_000_000 for _, b, _ in an.gate.held)


def test_a_snapshot_mid_join_resumes_with_the_same_verdict() -> None:
    """Pickled while rows wait for the last host's part (a worker restart)."""
    sent = _as_plugin_sends(make("nic-down", 3))
    late = [(t, r) for t, r in sent if isinstance(r, Topology) and r.host == "h3"]
    rest = [(t, r) for t, r in sent if (t, r) not in late]
    at = next(t for t, r in rest if not isinstance(r, Topology)) + 1_000_000_000
    before = [(t, r) for t, r in rest if t < at]
    after = [(at, replace(r, ts_ns=at)) for _, r in late]
    after += [(t, r) for t, r in rest if t >= at]
    an, out, nxt = Analyzer("job1"), [], T0
    for ts, rec in before:
        while nxt <= ts:
            out += an.evaluate(nxt)
            nxt += 100_000_000
        an.ingest(rec, ts)
    assert an.gate.held and an.gate.topo.join.parts
    an = roundtrip_engine(an)
    for ts, rec in after:
        while nxt <= ts:
            out += an.evaluate(nxt)
            nxt += 100_000_000
        an.ingest(rec, ts)
    out += an.evaluate(nxt)
    assert not an.gate.counts, an.gate.counts
    assert best_culprit(out) == best_culprit(run_analyzer(make("nic-down", 3))[1])
