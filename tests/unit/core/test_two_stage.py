"""The two-stage core: split by comm group, per-group analysis, job resolution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.producers.tracefile import ListWriter
from mycroft.schemas.codec import Codec
from mycroft.schemas.columns import FLOW_COLUMNS, OP_COLUMNS, RC_COLUMNS, empty
from mycroft.schemas.records import (
    Anomaly,
    BatchHeader,
    BlockedRank,
    BlockState,
    CommStatus,
    CommSummary,
    CompletionBatch,
    Culprit,
    Evidence,
    Record,
    RootCause,
    StateBatch,
)
from mycroft.schemas.text import comm_hex
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.analyze import run as single_stage
from mycroft.streams.core.comm_split import comm_group, split_by_comm
from mycroft.streams.core.event_time import EventClock, EventTimeConfig
from mycroft.streams.core.job_resolver import JobResolver, merge_culprits, resolve_hang
from mycroft.streams.core.topology import JobTopology
from mycroft.streams.core.two_stage import TwoStageReplay
from mycroft.topics import group_key, group_partition, parse_group_key
from tests.unit.samples import completion_batch

T0 = 1_767_225_600_000_000_000
S = 1_000_000_000
COMMS = np.array([0xF00D_0000_0000_0001, 7, 8, 9, 0xFFFF_FFFF_FFFF_FFFF], np.uint64)


def _host_batch() -> StateBatch:
    """5 comms x 4 ranks; op i has i % 3 flows, so flow ownership is uneven."""
    rc = empty(RC_COLUMNS, 20)
    rc["rank"] = np.tile(np.arange(4), 5)
    rc["comm"] = np.repeat(COMMS, 4)
    rc["issued_seq"] = np.arange(20)
    op = empty(OP_COLUMNS, 20)
    op["rank"], op["comm"], op["seq"] = rc["rank"], rc["comm"], rc["issued_seq"]
    op["nflows"] = np.arange(20) % 3
    flow = empty(FLOW_COLUMNS, int(op["nflows"].sum()))
    flow["peer"] = np.repeat(op["seq"], op["nflows"])  # flow -> its op's seq
    header = BatchHeader("job", "h0", 1, 42, T0, 100)
    return StateBatch(header, rc, op, flow)


def test_comm_group_is_stable_and_spreads() -> None:
    # pinned: a changed hash would move every comm to another stage-1 worker
    assert comm_group(COMMS, 8).tolist() == [1, 2, 3, 5, 6]
    assert int(comm_group(int(COMMS[0]), 8)) == 1
    spread = comm_group(np.arange(1, 4001, dtype=np.uint64) * 7919, 8)
    counts = np.bincount(spread, minlength=8)
    assert counts.min() > 350  # ~500 each
    assert int(comm_group(12345, 1)) == 0
    with pytest.raises(ValueError, match="comm groups"):
        comm_group(1, 0)


@pytest.mark.parametrize("groups", [1, 2, 3, 8])
def test_split_by_comm_partitions_rows_and_keeps_flows_with_their_op(
    groups: int,
) -> None:
    batch = _host_batch()
    parts = split_by_comm(batch, groups)
    assert sorted(parts) == list(range(groups))  # empty groups still hear the host
    assert sum(len(p.op) for p in parts.values()) == len(batch.op)
    assert sum(len(p.flow) for p in parts.values()) == len(batch.flow)
    for g, part in parts.items():
        assert isinstance(part, StateBatch)
        assert part.header == batch.header  # dedup key unchanged
        assert (comm_group(part.rc["comm"], groups) == g).all()
        assert (comm_group(part.op["comm"], groups) == g).all()
        assert int(part.op["nflows"].sum()) == len(part.flow)
        assert (
            part.flow["peer"].tolist()
            == np.repeat(part.op["seq"], part.op["nflows"]).tolist()
        )
    rcs = np.concatenate([p.rc for p in parts.values()])
    assert sorted(rcs["issued_seq"].tolist()) == list(range(20))


def test_split_by_comm_completion_and_malformed_flows() -> None:
    done = completion_batch()
    parts = split_by_comm(done, 4)
    assert all(isinstance(p, CompletionBatch) for p in parts.values())
    assert sum(len(p.op) for p in parts.values()) == 2
    bad = _host_batch()
    bad.op["nflows"][0] = 99
    for part in split_by_comm(bad, 2).values():
        assert len(part.flow) == 0 and (part.op["nflows"] == 0).all()


def test_group_key_round_trip() -> None:
    assert parse_group_key(group_key("job/with/slash", 3)) == ("job/with/slash", 3)
    with pytest.raises(ValueError, match="job/group"):
        parse_group_key("job-without-group")


def test_a_jobs_groups_spread_over_the_split_partitions() -> None:
    for job in ("sim-gh", "job-a", "x"):
        assert {group_partition(job, g, 2) for g in range(4)} == {0, 1}
        assert sorted(group_partition(job, g, 8) for g in range(8)) == list(range(8))


def _culprit(rank: int, comp: Component, conf: float, why: str = "") -> Culprit:
    return Culprit(rank, f"node{rank // 8}", comp, FaultKind.HANG, conf, reason=why)


PP, DP = 0xA0, 0xB0


def _pp_stall(tick_ns: int) -> CommSummary:
    """Group 0 sees a PP stall: rank 8 waits for rank 0, which never sent."""
    pp = CommStatus(
        PP,
        FaultKind.HANG,
        10,
        T0,
        tick_ns - T0,
        (
            BlockedRank(8, 10, BlockState.IN_OP, T0 + 100),
            BlockedRank(0, 10, BlockState.ABSENT),
        ),
        (_culprit(0, Component.HOST, 0.99, "rank 0 never issued seq 10"),),
        (Evidence("rank 8 waits on rank 0 (control)", 8, PP, 10),),
    )
    hang = Anomaly(
        "job:hang:a0:10", "job", FaultKind.HANG, (PP,), (8,), T0, tick_ns, "hang", "pp"
    )
    return CommSummary(
        "job", 0, 2, tick_ns, tick_ns, 3, 24, (pp,), (hang,), (hang.anomaly_id,)
    )


def _dp_stall(tick_ns: int, anomalies: tuple[Anomaly, ...] = ()) -> CommSummary:
    """Group 1: rank 0 is in a DP op issued earlier; rank 24's GPU hangs there."""
    dp = CommStatus(
        DP,
        FaultKind.HANG,
        5,
        T0,
        tick_ns - T0,
        tuple(BlockedRank(r, 5, BlockState.IN_OP, T0 + 50) for r in (0, 16, 24)),
        (_culprit(24, Component.GPU, 0.9, "kernel never ran"),),
    )
    ids = tuple(a.anomaly_id for a in anomalies)
    return CommSummary("job", 1, 2, tick_ns, tick_ns, 3, 24, (dp,), anomalies, ids)


def test_a_dp_hang_seen_as_a_pp_stall_names_the_dp_culprit() -> None:
    res = JobResolver("job")
    now = T0 + 2 * S
    res.ingest(_pp_stall(now), now)
    res.ingest(_dp_stall(now), now)
    out = res.evaluate(now)
    assert [type(f) for f in out] == [Anomaly, RootCause]
    rc = out[1]
    assert isinstance(rc, RootCause)
    assert rc.incident_id == f"job:hang:{comm_hex(PP)}:{T0}"  # first anomaly, as today
    assert (rc.culprits[0].rank, rc.culprits[0].component) == (24, Component.GPU)
    assert f"stuck in comm {comm_hex(DP)}" in rc.evidence[0].fact
    # same state a second later: nothing new; the DP comm firing later joins
    # the incident without a new revision (same culprit)
    later = now + S + 1
    res.ingest(_pp_stall(later), later)
    assert res.evaluate(later) == []
    dp_hang = Anomaly(
        "job:hang:b0:5",
        "job",
        FaultKind.HANG,
        (DP,),
        (0, 16, 24),
        T0,
        later,
        "hang",
        "",
    )
    res.ingest(_dp_stall(later + 1, (dp_hang,)), later + 1)
    assert res.evaluate(later + 1) == [dp_hang]
    assert res.incident is not None and len(res.incident.anomalies) == 2


def test_a_culprit_not_stuck_elsewhere_stays_the_culprit() -> None:
    pp = _pp_stall(T0 + 2 * S).comms[0]
    culprits, _ = resolve_hang([pp], {PP})
    assert (culprits[0].rank, culprits[0].component) == (0, Component.HOST)


def test_order_deadlock_across_groups_blames_the_minority() -> None:
    a, b = 0x1, 0x2
    in_a = [BlockedRank(r, 3, BlockState.IN_OP, T0 + 10) for r in (0, 1, 2)]
    in_b = [BlockedRank(3, 7, BlockState.IN_OP, T0 + 10)]
    sa = CommStatus(
        a,
        FaultKind.HANG,
        3,
        T0,
        S,
        (*in_a, BlockedRank(3, 3, BlockState.ABSENT)),
        (_culprit(3, Component.HOST, 0.99),),
    )
    sb = CommStatus(
        b,
        FaultKind.HANG,
        7,
        T0,
        S,
        (*in_b, *(BlockedRank(r, 7, BlockState.ABSENT) for r in (0, 1, 2))),
        (_culprit(0, Component.HOST, 0.5), _culprit(1, Component.HOST, 0.5)),
    )
    culprits, _ = resolve_hang([sa, sb], {a})
    assert [(c.rank, c.component) for c in culprits] == [(3, Component.HOST)]
    assert "order deadlock" in culprits[0].reason


def test_comm_summary_round_trips_through_the_codec() -> None:
    codec = Codec()
    s = _pp_stall(T0 + 2 * S)
    s = CommSummary(**{**vars(s), "comms": (*s.comms, *_dp_stall(T0).comms)})
    assert codec.decode(codec.encode(s)) == s


def _simulated(fault: str | None, seconds: float = 10.0) -> list[tuple[int, Record]]:
    cfg = SimConfig(tp=8, pp=2, dp=4, duration_s=seconds, seed=1, job_id="sim")
    writer = ListWriter()
    simulate(cfg, [parse_spec(fault)] if fault else [], writer)
    return writer.records


@pytest.mark.parametrize(
    ("fault", "rank", "component"),
    [
        ("gpu-hang:rank=3,at=5", 3, Component.GPU),
        ("host-stall:rank=40,at=5", 40, Component.HOST),
    ],
)
def test_two_groups_find_the_single_stage_culprit(
    fault: str, rank: int, component: Component
) -> None:
    records = _simulated(fault)
    replay = TwoStageReplay("sim", groups=2)
    for ts, rec in records:
        replay.feed(ts, rec)
    replay.close()
    assert len(replay.causes) == 1, replay.causes
    rc = next(iter(replay.causes.values()))
    assert (rc.culprits[0].rank, rc.culprits[0].component) == (rank, component)
    revisions = [r.revision for r in replay.revisions]
    assert revisions == sorted(set(revisions))  # updated, never repeated
    _, single = single_stage(records)
    best = next(iter(single.values())).culprits[0]
    assert (best.rank, best.component) == (rank, component)


def test_a_healthy_job_has_no_root_cause_in_two_stages() -> None:
    replay = TwoStageReplay("sim", groups=2)
    for ts, rec in _simulated(None):
        replay.feed(ts, rec)
    replay.close()
    assert replay.causes == {} and replay.anomalies == []
    assert replay.summaries > 150


def test_the_first_root_cause_waits_for_a_lagging_group() -> None:
    res = JobResolver("job", settle_s=2.0)
    now = T0 + 2 * S
    lagging = _dp_stall(now)
    lagging = CommSummary(**{**vars(lagging), "data_ns": now - S, "comms": ()})
    res.ingest(_pp_stall(now), now)
    res.ingest(lagging, now)
    assert [type(f) for f in res.evaluate(now)] == [Anomaly]  # group 1 is behind
    res.ingest(_dp_stall(now + 1), now + 1)  # caught up: the DP culprit
    (rc,) = res.evaluate(now + 1)
    assert isinstance(rc, RootCause)
    assert (rc.culprits[0].rank, rc.culprits[0].component) == (24, Component.GPU)


def test_a_silent_group_is_not_waited_for_and_lowers_confidence() -> None:
    res = JobResolver("job", settle_s=2.0)
    now = T0 + 2 * S
    behind = CommSummary(**{**vars(_dp_stall(now)), "data_ns": now - S, "comms": ()})
    res.ingest(behind, now)
    res.ingest(_pp_stall(now), now)
    assert [type(f) for f in res.evaluate(now)] == [Anomaly]
    later = now + 2 * S + 1
    res.ingest(_pp_stall(later), later)  # group 1 silent for settle_s
    (rc,) = res.evaluate(later)
    assert isinstance(rc, RootCause)
    assert (rc.culprits[0].rank, rc.culprits[0].confidence) == (0, 0.495)
    assert "1 of 2 comm groups" in rc.evidence[-1].fact
    res.ingest(_dp_stall(later + S), later + S)  # it catches up: revised
    (rc,) = res.evaluate(later + S)
    assert isinstance(rc, RootCause) and rc.revision == 1
    assert (rc.culprits[0].rank, rc.culprits[0].component) == (24, Component.GPU)


def test_a_group_catching_up_revises_the_answer_at_once() -> None:
    res = JobResolver("job", settle_s=2.0)
    now = T0 + 2 * S
    behind = CommSummary(**{**vars(_dp_stall(now)), "data_ns": now - S, "comms": ()})
    res.ingest(behind, now)
    res.ingest(_pp_stall(now), now)
    res.evaluate(now)
    later = now + 2 * S + 1
    res.ingest(_pp_stall(later), later)
    (first,) = res.evaluate(later)  # without group 1
    assert isinstance(first, RootCause) and first.culprits[0].rank == 0
    res.ingest(_pp_stall(later + S // 10), later + S // 10)
    assert res.evaluate(later + S // 10) == []  # nothing new: the period holds
    # Group 1's summaries come late, all at once (its worker was behind): the
    # next evaluation answers from them, not one refresh period later.
    now = later + 2 * S // 10
    res.ingest(_dp_stall(now), now)
    (rc,) = res.evaluate(now)
    assert isinstance(rc, RootCause) and rc.revision == 1
    assert (rc.culprits[0].rank, rc.culprits[0].component) == (24, Component.GPU)


class _Summaries(TwoStageReplay):
    """A ``TwoStageReplay`` that keeps every stage-1 summary."""

    def __init__(self, job_id: str, groups: int) -> None:
        super().__init__(job_id, groups)
        self.sent: list[CommSummary] = []

    def tick(self, now_ns: int) -> list[CommSummary]:
        out = super().tick(now_ns)
        self.sent.extend(out)
        return out


@pytest.fixture(scope="module")
def gpu_hang_summaries() -> list[CommSummary]:
    """Every stage-1 summary of a GPU hang at rank 3, 4 comm groups."""
    replay = _Summaries("sim", groups=4)
    for ts, rec in _simulated("gpu-hang:rank=3,at=5"):
        replay.feed(ts, rec)
    replay.close()
    return replay.sent


Answer = tuple[int, int, Component, float]


def _stage2(summaries: list[CommSummary], hold_ns: int) -> list[Answer]:
    """Stage 2 live: summaries pushed in arrival order, the partition read to
    its end at every step; each root cause's revision and top culprit."""
    clock = EventClock(EventTimeConfig(group_hold_ns=hold_ns))
    res, out = JobResolver("sim"), []
    for i, s in enumerate(summaries):
        clock.push(s, s.tick_ns)
        if i % 7 == 0:
            out += clock.advance(res, lambda _: "end")
    out += clock.finish(res)
    return [
        (
            r.revision,
            r.culprits[0].rank,
            r.culprits[0].component,
            r.culprits[0].confidence,
        )
        for r in out
        if isinstance(r, RootCause)
    ]


def _worker_order(sent: list[CommSummary], first: set[int]) -> list[CommSummary]:
    """The ``first`` groups' summaries, then the others' (two stage-1 workers
    in one partition, the second far behind the first)."""
    return [s for s in sent if s.group in first] + [
        s for s in sent if s.group not in first
    ]


SPLITS = [set(c) for c in itertools.combinations(range(4), 2)]


def test_the_job_stage_answer_does_not_depend_on_which_worker_sent_first(
    gpu_hang_summaries: list[CommSummary],
) -> None:
    """Each group holds the watermark: the answer is the one of every group
    read in step, however far one stage-1 worker trails the other."""
    hold = EventTimeConfig().group_hold_ns
    in_step = _stage2(gpu_hang_summaries, hold)
    assert [a[1:3] for a in in_step] == [(3, Component.GPU)]
    for first in SPLITS:
        assert _stage2(_worker_order(gpu_hang_summaries, first), hold) == in_step


def test_groups_arriving_late_revise_the_answer_to_theirs(
    gpu_hang_summaries: list[CommSummary],
) -> None:
    """With no hold, the trailing worker's groups come late (after the job's
    last tick was evaluated): the answer given without them is revised to
    the one of every group, with its confidence."""
    (expected,) = _stage2(gpu_hang_summaries, 0)
    for first in SPLITS:
        answers = _stage2(_worker_order(gpu_hang_summaries, first), 0)
        assert answers[-1][1:] == expected[1:], (first, answers)


def test_slowdown_culprits_of_several_groups_add_up() -> None:
    def view(*culprits: Culprit) -> CommStatus:
        return CommStatus(1, FaultKind.SLOWDOWN, 0, 0, 0, culprits=culprits)

    merged = merge_culprits(
        [
            view(_culprit(17, Component.PROXY, 0.6), _culprit(3, Component.GPU, 0.4)),
            view(_culprit(17, Component.PROXY, 0.5), _culprit(9, Component.GPU, 0.5)),
            view(),  # a slow comm of a group whose culprits sit on another entry
        ]
    )
    assert [(c.rank, c.component, c.confidence) for c in merged] == [
        (17, Component.PROXY, 0.55),
        (9, Component.GPU, 0.25),
        (3, Component.GPU, 0.2),
    ]


def test_a_link_verdict_absorbs_other_groups_timing_verdicts_on_its_nic() -> None:
    """G/T/D first across groups: the group holding rank 9's network flows
    blames its NIC; groups without them see rank 9 (or its NIC mate 8) late
    and blame the gpu. Those are the link fault's symptom. A gpu verdict
    off that NIC stays its own."""

    def view(*culprits: Culprit) -> CommStatus:
        return CommStatus(1, FaultKind.SLOWDOWN, 0, 0, 0, culprits=culprits)

    topo = JobTopology()
    for r in range(16):
        topo.rank_host[r] = f"h{r // 8}"
        topo.rank_nic[r] = f"mlx5_{(r % 8) // 2}"
    views = [
        view(_culprit(9, Component.NIC, 0.6)),
        view(_culprit(9, Component.GPU, 0.6)),
        view(_culprit(8, Component.GPU, 0.5), _culprit(12, Component.GPU, 0.3)),
    ]
    merged = merge_culprits(views, topo)
    assert [(c.rank, c.component, c.confidence) for c in merged] == [
        (9, Component.NIC, 0.567),
        (12, Component.GPU, 0.1),
    ]
    plain = merge_culprits(views)  # without topology only rank 9's own moves
    assert [(c.rank, c.component) for c in plain][:2] == [
        (9, Component.NIC),
        (8, Component.GPU),
    ]
