"""Slowdown root-cause rules that are general (not tuned to one fault).

* a whole host arriving late is one cause (one suspect, not 8 splitting the
  confidence), and only when its own intra-host collectives slowed too;
* GPUs sharing a NIC are one NIC for link evidence;
* lateness is judged per comm (a whole late host is on time in its own
  intra-host groups);
* a host-wide timing verdict, a timing verdict on fewer than
  ``min_timing_ops`` ops, or a pcie verdict resting only on finishing
  last, is capped so G/T/D or late-arrival evidence can revise it.
"""

from __future__ import annotations

import numpy as np

from mycroft.schemas.columns import DONE_FLOW_COLUMNS, DONE_OP_COLUMNS, empty
from mycroft.schemas.vocab import OP_NAMES, SEND, Component
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.collective_stat import CollectiveStat, Members
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.progress import ProgressStore
from mycroft.streams.core.rca_config import DEFAULT_RCA
from mycroft.streams.core.rca_hosts import _intra_host_slowdown, score_whole_hosts
from mycroft.streams.core.rca_slow import _merge_nic_mates, explain_slowdown
from mycroft.streams.core.rca_timing import late_scores
from mycroft.streams.core.suspect import Suspect, Suspects
from mycroft.streams.core.topology import JobTopology

MS = 1_000_000
PER_HOST, HOSTS = 4, 4


def _ctx() -> DetectContext:
    cfg = DetectorConfig()
    topo = JobTopology()
    for r in range(PER_HOST * HOSTS):
        topo.rank_host[r] = f"h{r // PER_HOST}"
        topo.rank_nic[r] = f"nic{(r % PER_HOST) // 2}"  # 2 GPUs per NIC
        topo.rank_gpu[r] = f"gpu{r % PER_HOST}"
    return DetectContext(
        "j", ProgressStore(cfg.history_ns), topo, BaselineBook(64), cfg
    )


def _stat(comm, seq, ranks, begin, dur):
    n = len(ranks)
    begin = np.asarray(begin, np.int64)
    return CollectiveStat(
        comm=comm,
        seq=seq,
        kind=0,
        nbytes=1 << 20,
        ranks=np.asarray(ranks, np.int32),
        issue_ns=begin.copy(),
        start_ns=begin,
        end_ns=begin.max() + np.asarray(dur, np.int64),
        prev_issue_ns=np.full(n, -1, np.int64),
    )


def _intra_stats(slow_host: int | None):
    out = []
    for seq in range(5):
        for h in range(HOSTS):
            ranks = list(range(h * PER_HOST, (h + 1) * PER_HOST))
            skew = 3 * MS if h == slow_host else MS // 10
            begin = [seq * 100 * MS + i * skew // PER_HOST for i in range(PER_HOST)]
            out.append(_stat(0x100 + h, seq, ranks, begin, [MS] * PER_HOST))
    return out


def test_intra_host_slowdown_is_a_peer_comparison():
    ctx = _ctx()
    assert _intra_host_slowdown(ctx, Members(_intra_stats(2))) == {
        "h0": -1.0,
        "h1": -1.0,
        "h2": 1.0,
        "h3": -1.0,
    }
    assert all(
        v < 0 for v in _intra_host_slowdown(ctx, Members(_intra_stats(None))).values()
    )


def test_whole_late_host_is_one_suspect_only_if_its_intra_ops_slowed():
    ctx = _ctx()
    late = {r: 50.0 * MS for r in range(4, 8)}
    suspects = Suspects(DEFAULT_RCA)
    slow_h1, slow_none = _intra_stats(1), _intra_stats(None)
    reps = score_whole_hosts(ctx, suspects, late, slow_h1, 100.0 * MS)
    assert len(reps) == 1 and list(suspects) == list(reps)
    assert suspects[next(iter(reps))].best[0] is Component.GPU
    # Intra-host collectives not slower: the host waits on another host.
    suspects = Suspects(DEFAULT_RCA)
    assert not score_whole_hosts(ctx, suspects, late, slow_none, 100.0 * MS)
    # Its own flows already explain it (G/T/D first).
    suspects = Suspects(DEFAULT_RCA, {5: Suspect(5)})
    suspects[5].add(Rule.FROZEN_READY_NOT_SENT, "G>T", score=2.0)
    assert not score_whole_hosts(ctx, suspects, late, slow_h1, 100.0 * MS)
    # Lateness led by a few ranks of the host is not host-wide.
    uneven = late | {4: 5.0 * MS}
    assert not score_whole_hosts(ctx, {}, uneven, slow_h1, 100.0 * MS)


def test_a_late_host_is_represented_by_the_gpu_that_starts_last_inside_it():
    """Cross-host lateness is alike for every rank of a host held back by
    one slow GPU; inside the host's own groups (one clock) that GPU still
    starts last, so it represents the host. Without such a leader the
    verdict stays a host-wide load."""
    ctx = _ctx()
    late = {r: 50.0 * MS for r in range(4, 8)}
    one_slow = []
    for seq in range(9):
        for h in range(HOSTS):
            ranks = list(range(h * PER_HOST, (h + 1) * PER_HOST))
            begin = [seq * 100 * MS + (4 * MS if r == 6 else 0) for r in ranks]
            one_slow.append(_stat(0x100 + h, seq, ranks, begin, [MS] * PER_HOST))
    suspects = Suspects(DEFAULT_RCA)
    assert score_whole_hosts(ctx, suspects, late, one_slow, 100.0 * MS) == {6}
    assert "rank 6 starts last by 4.0 ms" in suspects[6].reasons[0]
    # A lead just above the late floor creeps into the rank's own lateness
    # baseline; the leader must not vanish once it has.
    crept = ctx.book.get((0x101, 6, "late"))
    for _ in range(20):
        crept.observe(4 * MS, ctx.cfg, ctx.cfg.late_floor_s * 1e9)
    assert crept.stats()[0] == 4 * MS
    suspects = Suspects(DEFAULT_RCA)
    assert score_whole_hosts(ctx, suspects, late, one_slow, 100.0 * MS) == {6}
    suspects = Suspects(DEFAULT_RCA)
    (rep,) = score_whole_hosts(ctx, suspects, late, _intra_stats(1), 100.0 * MS)
    assert suspects[rep].reasons[0].endswith("host-wide GPU load")


def test_nic_mates_share_one_link_score():
    ctx = _ctx()
    suspects = Suspects(DEFAULT_RCA, {0: Suspect(0), 1: Suspect(1), 2: Suspect(2)})
    suspects[0].add(Rule.NIC_SEND_BACKLOG, "a", score=1.5)
    suspects[1].add(Rule.NIC_SEND_BACKLOG, "b", score=2.0)
    suspects[2].add(Rule.NIC_SEND_BACKLOG, "c", score=1.0)  # other NIC of the host
    _merge_nic_mates(ctx, suspects)
    assert suspects[1].scores[Component.NIC] == 3.5
    assert Component.NIC not in suspects[0].scores
    assert suspects[2].scores[Component.NIC] == 1.0


def test_lateness_is_judged_per_comm():
    ctx = _ctx()
    stats = []
    for seq in range(5):
        # comm A: ranks 0..3 on one host, together (no skew)
        stats.append(_stat(1, seq, [0, 1, 2, 3], [seq * MS] * 4, [MS] * 4))
        stats.append(_stat(1, seq + 10, [0, 1, 2, 3], [seq * MS] * 4, [MS] * 4))
        # comm B: rank 0 with 3 other hosts, 40 ms late
        stats.append(_stat(2, seq, [0, 4, 8, 12], [40 * MS, 0, 0, 0], [MS] * 4))
    found = late_scores(ctx, stats)
    mixed, worst = found.late, found.worst
    assert worst[0] == 40 * MS  # the worst comm, not diluted by comm A
    assert mixed[0] == 0


def test_hostwide_timing_verdict_is_capped():
    ctx = _ctx()
    stats = _intra_stats(1)
    for seq in range(5):
        # every rank of host 1 is late in its cross-host groups
        for i in range(PER_HOST):
            ranks = [i, 4 + i, 8 + i, 12 + i]
            stats.append(_stat(0x200 + i, seq, ranks, [0, 40 * MS, 0, 0], [MS] * 4))
    culprits, _ = explain_slowdown(ctx, stats, 0)
    assert culprits and culprits[0].host == "h1"
    assert culprits[0].component is Component.GPU
    assert culprits[0].confidence <= DEFAULT_RCA.hostwide_conf


def test_finishing_last_alone_is_a_capped_pcie_verdict():
    """Without flow counters (gloo) a rank that only finishes last may be a
    straggler's neighbour: named pcie, but revisable by late-arrival evidence."""
    ctx = _ctx()
    ranks = list(range(PER_HOST * HOSTS))
    lag = [MS] * len(ranks)
    lag[5] = 40 * MS
    stats = [_stat(1, s, ranks, [s * 100 * MS] * len(ranks), lag) for s in range(5)]
    culprits, _ = explain_slowdown(ctx, stats, 0)
    assert culprits[0].rank == 5 and culprits[0].component is Component.PCIE
    assert culprits[0].confidence <= DEFAULT_RCA.hostwide_conf
    # Once a rank arrives late, finishing last is no evidence of its own: who
    # finishes last behind a straggler depends on ring order.
    late = [
        [s * 100 * MS + (60 * MS if r == 9 else 0) for r in ranks] for s in range(5)
    ]
    stats += [_stat(1, 5 + s, ranks, late[s], lag) for s in range(5)]
    culprits, _ = explain_slowdown(ctx, stats, 0)
    assert culprits[0].rank == 9 and culprits[0].component is Component.GPU
    assert culprits[0].confidence > DEFAULT_RCA.hostwide_conf
    assert all(c.rank != 5 for c in culprits)


def test_rank_late_in_one_group_only_is_named():
    """A straggler that computes before one group's op and is on time for the
    next group's: as many on-time ops as late ones must not hide it."""
    ctx = _ctx()
    ranks = [0, 1, 2, 3]
    stats = []
    for s in range(5):
        t = s * 1000 * MS
        stats.append(_stat(1, s, ranks, [t, t, t + 400 * MS, t], [MS] * 4))
        stats.append(_stat(2, s, ranks, [t + 402 * MS] * 4, [MS] * 4))
    stats.append(_stat(2, 5, ranks, [5000 * MS] * 4, [MS] * 4))
    culprits, _ = explain_slowdown(ctx, stats, 0)
    assert culprits and culprits[0].rank == 2
    assert culprits[0].component is Component.GPU


def test_jitter_is_not_named_beside_a_large_slowdown():
    """Victims 200 ms late (excused: they wait early in another group) beside
    a rank 6 ms late: among many ranks one is always a few ms out; it cannot
    explain the slowdown and is not named."""
    ctx = _ctx()
    ranks = list(range(PER_HOST * HOSTS))
    stats = []
    for s in range(5):
        t = s * 1000 * MS
        begin = [t + (200 if 4 <= r < 8 else 6 if r == 9 else 0) * MS for r in ranks]
        stats.append(_stat(1, s, ranks, begin, [MS] * len(ranks)))
        # the victims arrive 300 ms early in their other group (waiting there)
        other = [4, 5, 6, 7, 11, 12, 13, 14, 15]
        stats.append(_stat(2, s, other, [t] * 4 + [t + 300 * MS] * 5, [MS] * 9))
        for h in range(HOSTS):  # many short intra-host ops: a short median span
            mine = list(range(h * PER_HOST, (h + 1) * PER_HOST))
            at = [t + (506 if r == 9 else 500) * MS for r in mine]
            stats.append(_stat(0x100 + h, s, mine, at, [MS] * PER_HOST))
    culprits, _ = explain_slowdown(ctx, stats, 0)
    assert all(c.rank != 9 for c in culprits)


def test_a_timing_verdict_on_one_op_is_capped():
    """A rank late once, the only suspect so far, is named but revisable;
    late in op after op, it stands at full confidence."""
    ctx = _ctx()
    ranks = list(range(PER_HOST * HOSTS))

    def late_once(s: int) -> CollectiveStat:
        t = s * 100 * MS
        return _stat(
            1, s, ranks, [t + (40 * MS if r == 6 else 0) for r in ranks], [MS] * 16
        )

    culprits, _ = explain_slowdown(ctx, [late_once(0)], 0)
    assert culprits[0].rank == 6 and culprits[0].component is Component.GPU
    assert culprits[0].confidence <= DEFAULT_RCA.hostwide_conf
    culprits, _ = explain_slowdown(
        ctx, [late_once(s) for s in range(DEFAULT_RCA.min_timing_ops)], 0
    )
    assert culprits[0].rank == 6 and culprits[0].confidence > DEFAULT_RCA.hostwide_conf


def test_every_verdict_is_capped_while_the_wire_timing_is_pending() -> None:
    """Transfers were timed before the onset and none since: the parts are
    not measured yet, so a verdict that would stand at full confidence is
    capped (revisable); once pairs are timed on both sides it stands."""
    ctx = _ctx()
    ranks = list(range(PER_HOST * HOSTS))
    onset = 10_000 * MS
    stats = [
        _stat(
            1,
            s,
            ranks,
            [onset + s * 100 * MS + (40 * MS if r == 6 else 0) for r in ranks],
            [MS] * 16,
        )
        for s in range(DEFAULT_RCA.min_timing_ops)
    ]
    times = ctx.store.transfers

    def send(rank: int, peer: int, t: int) -> None:
        op = empty(DONE_OP_COLUMNS, 1)
        op["rank"], op["kind"], op["nflows"] = rank, OP_NAMES.index("send"), 1
        fl = empty(DONE_FLOW_COLUMNS, 1)
        fl["peer"], fl["dir"], fl["chunks"] = peer, SEND, 4
        fl["first_ns"], fl["last_ns"], fl["wire_ns"] = t, t + MS, 400
        times.add(op, fl)

    for i in range(DEFAULT_RCA.transfer_min_before):
        send(0, 4, onset - (i + 1) * 100 * MS)
    culprits, _ = explain_slowdown(ctx, stats, onset)
    assert culprits[0].rank == 6
    assert culprits[0].confidence == DEFAULT_RCA.hostwide_conf
    for i in range(DEFAULT_RCA.transfer_min_after):
        send(0, 4, onset + i * 100 * MS)
    culprits, _ = explain_slowdown(ctx, stats, onset)
    assert culprits[0].rank == 6
    assert culprits[0].confidence > DEFAULT_RCA.hostwide_conf


def _straggler_stats(early_ms: int):
    """Rank 1 is 100 ms late at every op of comm A and arrives ``early_ms``
    before the others at every op of comm B (other hosts' ranks)."""
    stats = []
    for seq in range(8):
        t = seq * 500 * MS
        stats.append(_stat(0xA, seq, [0, 1, 4, 8], [t, t + 100 * MS, t, t], [MS] * 4))
        b = t + 300 * MS
        begin = [b, b - early_ms * MS, b, b]
        stats.append(_stat(0xB, seq, [12, 1, 5, 9], begin, [MS] * 4))
    return stats


def test_a_wait_explains_lateness_up_to_its_length():
    ctx = _ctx()
    # A straggler that is a few ms early in another group still straggles.
    culprits, _ = explain_slowdown(ctx, _straggler_stats(early_ms=10), 0)
    assert culprits and culprits[0].rank == 1
    assert culprits[0].component is Component.GPU
    found = late_scores(ctx, _straggler_stats(early_ms=10))
    assert found.waits[1] == 10 * MS  # it stood there until the others came
    # Standing 150 ms in group B covers its 100 ms of lateness: a waiter.
    stats = _straggler_stats(early_ms=150)
    assert late_scores(ctx, stats).waits[1] == 150 * MS
    culprits, _ = explain_slowdown(ctx, stats, 0)
    assert all(c.rank != 1 for c in culprits)
