"""Link rules of the slowdown analysis: G/T/D gaps of cross-host flows.

* the T-D detector fires on a flow lag that persists above its role's
  baseline, and stays silent on chunk-granularity jitter;
* lagging (T-D) flows name the smallest part they share: one GPU they
  drain into (PCIe), one NIC (both its GPUs, its host's other NIC fine),
  else the network path of the host they all touch;
* a ready-not-sent backlog (G-T) is attributed to the part its flows share:
  one sending NIC, one receiving GPU (PCIe), or many NICs (the network);
* a backlog on one GPU's sends while its NIC mate sends normally is that
  GPU's proxy (the NIC is shared, the proxy is not);
* one NIC pair is ambiguous: both ends named, neither certain, until the
  transport is seen stopping (the sender) or draining steadily past a clean
  NIC mate (the receiver's PCIe).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mycroft.schemas.records import Anomaly
from mycroft.schemas.vocab import RECV, SEND, Component
from mycroft.streams.core.collective_stat import CollectiveStat
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.detect_slow import observe_collective, role_gap_baseline
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.flow_features import FlowFeatures, flow_features
from mycroft.streams.core.link_rules import score_links
from mycroft.streams.core.progress import FLAT_FLOW
from mycroft.streams.core.rca_config import DEFAULT_RCA
from mycroft.streams.core.rca_slow import _waited_on_transfers
from mycroft.streams.core.suspect import Suspects
from mycroft.streams.core.topology import CommInfo
from mycroft.streams.core.transfer_times import PairChanges
from tests.unit.core.test_slow_rules import HOSTS, MS, PER_HOST
from tests.unit.core.test_slow_rules import _ctx as hosts_ctx

DP = [0x200 + i for i in range(PER_HOST)]  # DP ring i: rank i of every host


def _ctx() -> DetectContext:
    """The hosts, NICs and GPUs of ``test_slow_rules`` plus the DP rings."""
    ctx = hosts_ctx()
    for i, comm in enumerate(DP):
        ranks = tuple(i + PER_HOST * h for h in range(HOSTS))
        ctx.topo.comms[comm] = CommInfo(comm, f"dp{i}", "dp", ranks)
    return ctx


def _members(comm: int) -> list[int]:
    return [comm - 0x200 + PER_HOST * h for h in range(HOSTS)]


def _run_op(ctx: DetectContext, comm: int, seq: int, td: dict[int, int]) -> list:
    """One DP ring op: a mid-op snapshot per host, then its completion."""
    ranks = _members(comm)
    t0 = (seq + 1) * 1000 * MS
    for i, r in enumerate(ranks):
        snap = np.zeros(2, dtype=FLAT_FLOW)
        snap["tick_ns"] = t0 + 50 * MS
        snap["rank"], snap["comm"], snap["seq"] = r, comm, seq
        snap["channel"] = [0, 1]
        snap["peer"] = ranks[(i + 1) % len(ranks)]
        snap["dir"] = SEND
        snap["total"] = 64
        snap["gpu_ready"] = 21
        snap["transmitted"] = 20
        snap["done"] = 20 - td.get(r, seq % 2)  # healthy: 0 or 1 chunk
        ctx.store.host(f"h{r // PER_HOST}").keep_snapshot(t0 + 50 * MS, snap)
    n = len(ranks)
    stat = CollectiveStat(
        comm=comm,
        seq=seq,
        kind=0,
        nbytes=1 << 30,
        ranks=np.asarray(ranks, np.int32),
        issue_ns=np.full(n, t0, np.int64),
        start_ns=np.full(n, t0, np.int64),
        end_ns=np.full(n, t0 + 90 * MS, np.int64),
        prev_issue_ns=np.full(n, -1, np.int64),
    )
    return observe_collective(ctx, stat, t0 + 100 * MS)


def _td(found: list[Anomaly]) -> list[Anomaly]:
    return [a for a in found if a.detector == "slow_td"]


def test_td_detector_fires_on_a_persistent_lag_only():
    ctx = _ctx()
    healthy = [a for seq in range(12) for a in _td(_run_op(ctx, DP[1], seq, {}))]
    assert not healthy  # one chunk of granularity is not a lag
    # Healthy gaps jitter 0-1 chunk: the band (median + 6 sigma, its own and
    # the role's) ends near 5 chunks, so a lag of 8 is out of both.
    lagged = [_td(_run_op(ctx, DP[1], seq, {5: 8})) for seq in range(12, 16)]
    assert not lagged[0] and not lagged[1]  # persistence: 3 of the last 5
    assert [a.ranks for a in lagged[2]] == [(5,)]
    # The pooled role baseline warmed on the healthy ops and did not learn the lag.
    assert role_gap_baseline(ctx, DP[1], "td").stats()[0] <= 1.0


def test_td_detector_ignores_single_host_ops():
    ctx = _ctx()
    ctx.topo.comms[0x100] = CommInfo(0x100, "tp0", "tp", (0, 1, 2, 3))
    st = CollectiveStat(
        comm=0x100,
        seq=0,
        kind=0,
        nbytes=1 << 20,
        ranks=np.arange(4, dtype=np.int32),
        issue_ns=np.zeros(4, np.int64),
        start_ns=np.zeros(4, np.int64),
        end_ns=np.full(4, MS, np.int64),
        prev_issue_ns=np.full(4, -1, np.int64),
    )
    assert not _td(observe_collective(ctx, st, 2 * MS))
    assert ctx.book.find(("flow", "tp", "td")) is None


def _flow(src: int, dst: int, gt: float = 0.0, td: float = 0.0, ch: int = 0):
    comm = DP[src % PER_HOST]
    return FlowFeatures(src, dst, ch, comm, 64.0, 0.5, 0, 0, gt, td, started=True)


def _healthy_flows() -> list[FlowFeatures]:
    return [
        _flow(r, (r + PER_HOST) % (PER_HOST * HOSTS), ch=ch)
        for r in range(PER_HOST * HOSTS)
        for ch in range(2)
    ]


def _warm(ctx: DetectContext) -> None:
    for comm in DP:
        for gap in ("gt", "td"):
            base = role_gap_baseline(ctx, comm, gap)
            for v in (0.0, 0.2, 0.0, 0.4, 0.0, 0.1, 0.0, 0.3):
                base.observe(v, ctx.cfg, ctx.cfg.gap_floor_chunks)


def _with(flows: list[FlowFeatures], bad: dict[tuple[int, int], tuple[float, float]]):
    out = []
    for f in flows:
        gt, td = bad.get((f.rank, f.peer), (0.0, 0.0))
        out.append(_flow(f.rank, f.peer, gt, td, f.channel))
    return out


def _best(suspects: Suspects) -> tuple[int, Component, float]:
    total = sum(s.best[1] for s in suspects.values())
    sus = max(suspects.values(), key=lambda s: s.best[1])
    return sus.rank, sus.best[0], sus.best[1] / total


def test_healthy_flows_name_nobody():
    ctx = _ctx()
    _warm(ctx)
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _healthy_flows())
    assert not suspects


def test_lagging_flows_name_the_host_they_all_touch():
    ctx = _ctx()
    _warm(ctx)
    # Host 1 (ranks 4..7): its sends and the sends into it acknowledge late.
    bad = {(r, r + 4): (0.0, 3.0) for r in range(4, 8)}
    bad |= {(r, r + 4): (0.0, 3.0) for r in range(4)}
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _with(_healthy_flows(), bad))
    rank, comp, _ = _best(suspects)
    assert comp is Component.NETWORK and rank // PER_HOST == 1
    peer, _ = suspects[rank].flow or (None, None)
    assert peer is not None and peer // PER_HOST != 1


def test_lag_on_every_send_of_one_nic_is_that_nic():
    """Under credits a capped NIC holds its posted slots: T-D on the sends of
    both its GPUs, while the other NIC of its host sends normally."""
    ctx = _ctx()
    _warm(ctx)
    bad = {(4, 8): (0.0, 4.0), (5, 9): (0.0, 4.0)}  # NIC 0 of host 1
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _with(_healthy_flows(), bad))
    rank, comp, _ = _best(suspects)
    assert (rank in (4, 5), comp) == (True, Component.NIC)
    assert str(Rule.NIC_TD_LAG) in suspects[rank].rules


def test_lag_on_one_gpu_while_its_nic_mate_sends_normally_is_not_the_nic():
    """A NIC is shared by its GPUs: one GPU's flows lagging while its NIC
    mate's do not are their route (the network), not the NIC."""
    ctx = _ctx()
    _warm(ctx)
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _with(_healthy_flows(), {(4, 8): (0.0, 4.0)}))
    assert _best(suspects)[1] is Component.NETWORK


def test_lag_from_one_nic_into_one_gpu_ties_the_nic_with_that_gpus_pcie():
    """Both GPUs of one NIC lag into one GPU only: a capped transmit and a
    slow PCIe write into the receiver hold the same posted slots, so the
    receiving GPU's PCIe is named too, weaker, and the answer stays below
    the revisable cap."""
    ctx = _ctx()
    _warm(ctx)
    flows = _with(_healthy_flows(), {(4, 8): (0.0, 4.0)}) + [_flow(5, 8, 0.0, 4.0)]
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, flows)
    rank, comp, conf = _best(suspects)
    assert (rank in (4, 5), comp) == (True, Component.NIC)
    assert suspects[8].best[0] is Component.PCIE
    assert str(Rule.PCIE_TD_LAG) in suspects[8].rules
    assert conf <= DEFAULT_RCA.hostwide_conf


def test_lag_into_one_gpu_from_several_nics_is_its_pcie():
    """Under credits a slow PCIe write into the receiving GPU slows the wire
    into it: T-D on every flow into it, from two NICs, its NIC mate fine."""
    ctx = _ctx()
    _warm(ctx)
    bad = {(2, 6): (0.0, 4.0), (14, 6): (0.0, 4.0)}
    flows = _with(_healthy_flows(), bad) + [_flow(14, 6, 0.0, 4.0, ch=1)]
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, flows)
    assert _best(suspects)[:2] == (6, Component.PCIE)
    assert str(Rule.PCIE_TD_LAG) in suspects[6].rules


def test_backlog_from_one_nic_both_ways_is_that_nic():
    ctx = _ctx()
    _warm(ctx)
    # NIC 0 of host 1 (ranks 4, 5) flaps: flows out of it and into it stall.
    bad = {(4, 8): (5.0, 0.0), (5, 9): (5.0, 0.0), (0, 4): (5.0, 0.0)}
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _with(_healthy_flows(), bad))
    rank, comp, _ = _best(suspects)
    assert (comp, rank in (4, 5)) == (Component.NIC, True)
    assert suspects[rank].flow is not None and suspects[rank].flow[0] in (8, 9)


def test_a_nic_that_does_not_take_data_in_is_named_with_a_cross_host_flow():
    """A NIC carries traffic between hosts only: the flow named with it is
    never one to its NIC mate, even when that is the rank's busiest flow."""
    ctx = _ctx()
    _warm(ctx)
    # NIC 0 of host 1 (ranks 4, 5) takes nothing in from two other NICs;
    # its ranks send only to each other (NVLink) in this window.
    bad = {(0, 4): (5.0, 0.0), (10, 5): (5.0, 0.0)}
    flows = [f for f in _healthy_flows() if f.rank not in (4, 5)]
    flows = _with(flows + [_flow(0, 4), _flow(10, 5)], bad)
    flows += [_flow(4, 5, gt=9.0), _flow(5, 4, gt=9.0)]
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, flows)
    rank, comp, _ = _best(suspects)
    assert (rank, comp) in ((4, Component.NIC), (5, Component.NIC))
    assert suspects[rank].flow in ((0, 0), (10, 0))


def test_backlog_into_one_gpu_from_several_nics_is_its_pcie():
    ctx = _ctx()
    _warm(ctx)
    # Rank 6 drains slowly: its senders (on hosts 0 and 3) pile up at G-T.
    bad = {(2, 6): (4.0, 0.0), (14, 6): (4.0, 0.0)}
    flows = _with(_healthy_flows(), bad) + [_flow(14, 6, 4.0, 0.0, ch=1)]
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, flows)
    assert _best(suspects)[:2] == (6, Component.PCIE)


def test_backlog_over_many_nics_is_the_network():
    """Hosts 1 -> 2 and 3 -> 0 back up alike (four hosts, each touched by
    half the flows): which side's switch congests is open, so every tied
    host is named and the first one is far from sure (a later answer from
    more flows can revise it)."""
    ctx = _ctx()
    _warm(ctx)
    # Congestion between hosts 0-1 and 2-3: every flow crossing it backs up.
    bad = {(r, r + 4): (4.0, 0.0) for r in range(4, 8)}
    bad |= {(r, r - 12): (4.0, 0.0) for r in range(12, 16)}
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _with(_healthy_flows(), bad))
    rank, comp, conf = _best(suspects)
    assert comp is Component.NETWORK
    assert suspects[rank].flow is not None
    named = {
        r // PER_HOST for r, s in suspects.items() if Component.NETWORK in s.scores
    }
    assert named == {0, 1, 2, 3}
    assert conf < 0.35


def test_one_nic_pair_is_ambiguous():
    ctx = _ctx()
    _warm(ctx)
    # Both GPUs of NIC 0 on host 1 send to both GPUs of NIC 0 on host 2 and
    # nothing else backs up: the sending NIC (Table 4) or the receiving one.
    bad = {(4, 8): (4.0, 0.0), (5, 9): (4.0, 0.0)}
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _with(_healthy_flows(), bad))
    rank, comp, conf = _best(suspects)
    assert (rank in (4, 5), comp) == (True, Component.NIC)  # the sender first
    far = [s for r, s in suspects.items() if r in (8, 9)]
    assert far and far[0].best[0] is Component.NIC
    assert conf < 0.6  # more flows must be able to revise it


def test_backlog_on_one_gpu_of_a_shared_nic_is_its_proxy():
    ctx = _ctx()
    _warm(ctx)
    # Rank 4's sends back up; rank 5, behind the same NIC, sends normally.
    bad = {(4, 8): (4.0, 0.0)}
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _with(_healthy_flows(), bad))
    rank, comp, _ = _best(suspects)
    assert (rank, comp) == (4, Component.PROXY)
    assert suspects[4].flow == (8, 0)
    assert suspects[8].best[0] is Component.PCIE  # the far end, weaker


def _pair(steps: dict[str, int]) -> list[FlowFeatures]:
    """Healthy flows plus rank 4 -> 8 backing up, ``steps`` set on them."""
    return [
        replace(f, **steps) if (f.rank, f.peer) == (4, 8) else f
        for f in _with(_healthy_flows(), {(4, 8): (4.0, 0.0)})
    ]


def test_a_pair_whose_transport_stopped_is_the_senders():
    """T standing still with posted data waiting: the proxy stalled (or the
    link went down); a slow receive path drains, so it is not named."""
    ctx = _ctx()
    _warm(ctx)
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _pair({"drain_steps": 3, "stall_steps": 2}))
    assert _best(suspects)[:2] == (4, Component.PROXY)
    assert 8 not in suspects


def test_a_pair_draining_steadily_past_a_clean_nic_mate_is_the_receivers():
    """Rank 4's NIC mate sends normally (not the NIC) and T kept moving (a
    proxy holds data back only by not running): the receiver's PCIe."""
    ctx = _ctx()
    _warm(ctx)
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _pair({"drain_steps": 3}))
    rank, comp, conf = _best(suspects)
    assert (rank, comp) == (8, Component.PCIE)
    assert 4 not in suspects and conf == 1.0


def _wire(
    slowed: list[tuple[int, int]], clean: list[tuple[int, int]] = ()
) -> PairChanges:
    """Cross-host pairs the wire timing measured: ``slowed`` 3x, ``clean``
    as before."""
    pairs = sorted([(p, True) for p in slowed] + [(p, False) for p in clean])
    return PairChanges(
        np.array([r for (r, _), _ in pairs]),
        np.array([q for (_, q), _ in pairs]),
        np.array([np.log(3.0) if s else 0.0 for _, s in pairs]),
        np.array([s for _, s in pairs]),
    )


def test_a_pair_slowed_on_the_wire_is_the_end_that_moves_nothing_else_as_before():
    """One GPU to one GPU, no drain step seen (both ends possible from the
    flows): the wire saw the pair slowed, and rank 4's send to another host
    as before clears the sender; rank 8 receiving from another host as
    before clears the receiver instead."""
    ctx = _ctx()
    _warm(ctx)
    flows = _with(_healthy_flows(), {(4, 8): (4.0, 0.0)})
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, flows, _wire(slowed=[(4, 8)], clean=[(4, 12)]))
    assert _best(suspects)[:2] == (8, Component.PCIE)
    assert 4 not in suspects
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, flows, _wire(slowed=[(4, 8)], clean=[(0, 8)]))
    assert _best(suspects)[0] == 4
    assert 8 not in suspects
    # both ends moving other transfers as before: the flows decide (both)
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, flows, _wire(slowed=[(4, 8)], clean=[(4, 12), (0, 8)]))
    assert {4, 8} <= set(suspects)
    # T seen standing still is read first: a sender's proxy that stops sees
    # its in-flight sends done late, stretching that pair's wire time only
    suspects = Suspects(DEFAULT_RCA)
    stopped = _pair({"stall_steps": 2})
    score_links(ctx, suspects, stopped, _wire(slowed=[(4, 8)], clean=[(4, 12)]))
    assert _best(suspects)[:2] == (4, Component.PROXY)
    assert 8 not in suspects


def test_a_nic_mate_slowed_on_the_wire_does_not_clear_the_nic():
    """Rank 5 shows no backlog, but the wire timing saw its sends slowed: it
    does not send normally, so the NIC they share stays the suspect (a
    capped NIC slows both GPUs' sends; one's gaps may stay in band)."""
    ctx = _ctx()
    _warm(ctx)
    flows = _with(_healthy_flows(), {(4, 8): (4.0, 0.0)})
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, flows, _wire(slowed=[(5, 9)]))
    rank, comp, _ = _best(suspects)
    assert (rank, comp) == (4, Component.NIC)
    # the draining pair is no longer the receiver's alone either
    suspects = Suspects(DEFAULT_RCA)
    drained = [
        replace(f, drain_steps=3) if (f.rank, f.peer) == (4, 8) else f for f in flows
    ]
    score_links(ctx, suspects, drained, _wire(slowed=[(5, 9)]))
    assert _best(suspects)[:2] == (4, Component.NIC)
    assert suspects[8].best[0] is Component.PCIE  # the far end, weaker


def test_a_pair_seen_in_one_snapshot_names_both_ends():
    ctx = _ctx()
    _warm(ctx)
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _pair({}))
    assert _best(suspects)[:2] == (4, Component.PROXY)
    assert suspects[8].best[0] is Component.PCIE


def test_steps_of_a_backlog_count_drains_and_stalls():
    rows = np.zeros(8, dtype=FLAT_FLOW)
    rows["tick_ns"] = np.arange(8) * 100 * MS
    rows["rank"], rows["peer"], rows["comm"], rows["dir"] = 4, 8, DP[0], SEND
    rows["total"], rows["gpu_ready"] = 64, 30
    rows["transmitted"] = [10, 12, 14, 14, 14, 20, 30, 30]
    rows["done"] = rows["transmitted"]
    (f,) = flow_features(rows)
    # 10 -> 12 -> 14 drain, 14 -> 14 -> 14 stall, -> 20 drains, -> 30 none left.
    assert (f.drain_steps, f.stall_steps) == (3, 2)


def test_flow_gap_is_the_worst_op_not_the_window_mean():
    """A flapping link stalls some ops only: the flow's gap is its worst op's."""
    rows = np.zeros(12, dtype=FLAT_FLOW)
    rows["tick_ns"] = np.arange(12) * 100 * MS
    rows["rank"], rows["peer"], rows["comm"], rows["dir"] = 4, 8, DP[0], SEND
    rows["seq"] = np.arange(12) // 2  # 6 ops, 2 snapshots each
    rows["total"], rows["gpu_ready"], rows["transmitted"] = 64, 20, 20
    rows["done"] = 20
    rows["transmitted"][4:6] = 12  # op 2 stalled: 8 chunks ready, not sent
    (f,) = flow_features(rows)
    assert f.started and f.gt_chunks == 8.0 and f.td_chunks == 0.0
    # Snapshots before the first chunk or after the last do not count.
    rows["gpu_ready"], rows["transmitted"], rows["done"] = 0, 0, 0
    (f,) = flow_features(rows)
    assert not f.started and f.gt_chunks == 0.0


def test_a_freeze_is_placed_at_its_op_and_first_snapshot():
    rows = np.zeros(12, dtype=FLAT_FLOW)
    rows["tick_ns"] = np.arange(12) * 100 * MS
    rows["rank"], rows["peer"], rows["comm"], rows["dir"] = 4, 8, DP[0], SEND
    rows["seq"] = np.array([0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 3, 3])
    rows["total"], rows["gpu_ready"], rows["transmitted"] = 64, 20, 20
    rows["transmitted"][2:8] = 3  # op 1: T still for 500 ms, 17 chunks ready
    (f,) = flow_features(rows)
    assert (f.episodes, f.longest_freeze_ns) == (1, 500 * MS)
    assert (f.freeze_seq, f.freeze_start_ns) == (1, 200 * MS)
    rows["transmitted"][2:8] = 20  # no freeze
    (f,) = flow_features(rows)
    assert (f.episodes, f.freeze_seq, f.freeze_start_ns) == (0, -1, -1)


def _p2p(seq: int, send_at: int, recv_at: int) -> CollectiveStat:
    issue = np.array([send_at, recv_at], np.int64)
    return CollectiveStat(
        comm=77,
        seq=seq,
        kind=0,
        nbytes=1 << 20,
        ranks=np.array([4, 8], np.int32),
        issue_ns=issue,
        start_ns=issue,
        end_ns=issue + 900 * MS,
        prev_issue_ns=np.full(2, -1, np.int64),
    )


def test_a_receiver_there_before_the_transfer_froze_waited():
    """Rank 8 had enqueued op 5 when rank 4's ready data stopped moving for
    800 ms: its later lateness is waiting, not its GPU. Had it come halfway
    through the freeze or later, it is what rank 4 waited on."""
    frozen = FlowFeatures(
        4, 8, 0, 77, 64.0, 0.5, 1, 800 * MS, 7.0, 0.0, True, 5, 10_000 * MS
    )
    assert set(_waited_on_transfers([frozen], [_p2p(5, 9_990 * MS, 9_950 * MS)]))
    assert set(_waited_on_transfers([frozen], [_p2p(5, 9_990 * MS, 10_300 * MS)]))
    assert not _waited_on_transfers([frozen], [_p2p(5, 9_990 * MS, 10_500 * MS)])
    assert not _waited_on_transfers([frozen], [_p2p(6, 9_990 * MS, 9_950 * MS)])
    moving = FlowFeatures(4, 8, 0, 77, 64.0, 0.5, 0, 0, 7.0, 0.0, True)
    assert not _waited_on_transfers([moving], [_p2p(5, 9_990 * MS, 9_950 * MS)])


def test_the_members_of_a_ring_op_there_before_its_transfer_froze_waited():
    """Rank 4's ready data to rank 8 stopped moving for 800 ms inside a ring
    op of ranks 0, 4, 8 and 12: rank 12, there before the freeze, waited on
    the data rank 8 passes on; rank 0, which came after it began, and the
    frozen sender stay suspects."""
    frozen = FlowFeatures(
        4, 8, 0, 77, 64.0, 0.5, 1, 800 * MS, 7.0, 0.0, True, 5, 10_000 * MS
    )
    issue = np.array([10_600, 9_990, 9_950, 9_900], np.int64) * MS
    ring = CollectiveStat(
        comm=77,
        seq=5,
        kind=0,
        nbytes=1 << 20,
        ranks=np.array([0, 4, 8, 12], np.int32),
        issue_ns=issue,
        start_ns=issue,
        end_ns=issue + 900 * MS,
        prev_issue_ns=np.full(4, -1, np.int64),
    )
    assert set(_waited_on_transfers([frozen], [ring])) == {8, 12}
    # A pair's op has no other member to pass the data on.
    assert set(_waited_on_transfers([frozen], [_p2p(5, 9_990 * MS, 9_950 * MS)])) == {8}


def _recv_rows(ticks_ms: list[int], seq: int = 5) -> np.ndarray:
    """Snapshots of rank 8's receive flow of op ``seq`` from rank 4."""
    rows = np.zeros(len(ticks_ms), dtype=FLAT_FLOW)
    rows["tick_ns"] = np.asarray(ticks_ms, np.int64) * MS
    rows["rank"], rows["peer"], rows["comm"], rows["seq"] = 8, 4, 77, seq
    rows["dir"], rows["total"] = RECV, 64
    return rows


def test_a_receiver_waits_on_a_transfer_not_completed_yet():
    """Live, the frozen op may not be joined when root cause runs (the
    sender's completion comes last): the receiver's arrival is then the
    first snapshot holding its receive flow of the op."""
    frozen = FlowFeatures(
        4, 8, 0, 77, 64.0, 0.5, 1, 800 * MS, 7.0, 0.0, True, 5, 10_000 * MS
    )
    there = _recv_rows([9_900, 10_000, 10_100])
    assert set(_waited_on_transfers([frozen], [], there)) == {8}
    assert not _waited_on_transfers([frozen], [], _recv_rows([10_500, 10_600]))
    assert not _waited_on_transfers([frozen], [], _recv_rows([9_900], seq=6))
    assert not _waited_on_transfers([frozen], [])  # no snapshots: no verdict
    # A joined op is read from its completion, not from the snapshots.
    late = [_p2p(5, 9_990 * MS, 10_500 * MS)]
    assert not _waited_on_transfers([frozen], late, there)


def test_td_bursts_of_granted_slots_are_not_a_lag():
    """Credit-based counters: a healthy flow shows T-D = 0 while it waits for
    credit, and a burst of 3 posted slots while they are on the wire (median
    and MAD of such samples are 0). The bursts are healthy, a lag well beyond
    them still fires."""
    ctx = _ctx()
    idle = dict.fromkeys(_members(DP[1]), 0)
    healthy = [
        a
        for seq in range(40)
        for a in _td(_run_op(ctx, DP[1], seq, idle | ({5: 3} if seq % 4 else {})))
    ]
    assert not healthy
    lagged = [_td(_run_op(ctx, DP[1], seq, idle | {5: 12})) for seq in range(40, 43)]
    assert [a.ranks for a in lagged[2]] == [(5,)]


def test_backlog_into_one_gpu_over_many_nics_is_its_pcie_not_the_network():
    """Most of the backlog's excess drains into rank 6 from three hosts;
    smaller backlogs between other hosts ride on the slow ring behind it.
    The flagged flows touch many NICs, none on half of them, yet one GPU
    receives most of the excess and its NIC mate none."""
    ctx = _ctx()
    _warm(ctx)
    into_6 = [_flow(src, 6, 6.0) for src in (0, 8, 12)]
    others = [_flow(s, d, 2.0) for s, d in ((1, 9), (2, 10), (3, 15), (13, 1), (14, 2))]
    suspects = Suspects(DEFAULT_RCA)
    score_links(ctx, suspects, _healthy_flows() + into_6 + others)
    assert _best(suspects)[:2] == (6, Component.PCIE)


def _with_recv(send: np.ndarray, posted: int, lead_ns: int = 50 * MS) -> np.ndarray:
    """``send`` snapshots plus the receiver's recv flow, each ``lead_ns``
    before a send snapshot, with ``posted`` buffers (its G)."""
    recv = send.copy()
    recv["tick_ns"] -= lead_ns
    recv["rank"], recv["peer"] = send["peer"], send["rank"]
    recv["dir"] = RECV
    recv["gpu_ready"] = posted
    recv["transmitted"] = recv["done"] = send["done"]
    return np.concatenate([send, recv])


def test_a_backlog_without_the_receivers_credit_is_not_the_senders():
    """G-T split by the receiver's posted buffers (its recv flow's G): data
    the receiver posted no buffer for waits on the receiver, not on the
    sender's transport; data with buffers posted does not."""
    rows = np.zeros(6, dtype=FLAT_FLOW)
    rows["tick_ns"] = np.arange(6) * 100 * MS
    rows["rank"], rows["peer"], rows["comm"], rows["dir"] = 4, 8, DP[0], SEND
    rows["seq"] = np.arange(6) // 2
    rows["total"], rows["gpu_ready"], rows["transmitted"], rows["done"] = 64, 30, 10, 10
    (waits,) = flow_features(_with_recv(rows, posted=10))
    assert waits.gt_chunks == 0.0 and waits.wait_chunks == 20.0
    (sends,) = flow_features(_with_recv(rows, posted=64))
    assert sends.gt_chunks == 20.0 and sends.wait_chunks == 0.0
    (part,) = flow_features(_with_recv(rows, posted=18))
    assert part.gt_chunks == 8.0 and part.wait_chunks == 12.0
    (unknown,) = flow_features(rows)  # no recv flow seen: counts as posted
    assert unknown.gt_chunks == 20.0 and unknown.wait_chunks == 0.0


def test_the_receiver_is_read_at_the_senders_instant():
    """What the receiver posted is read at its snapshot of the sender's
    tick or before, never later (G only grows: it would credit buffers
    posted after the sender was seen waiting); a receiver that reports
    receive flows but none of this op has not issued it; and a snapshot of
    the same tick that holds data the sender had not sent was taken after
    the sender's: the buffers it posted meanwhile (at most one per chunk
    that arrived meanwhile) are not counted."""
    rows = np.zeros(4, dtype=FLAT_FLOW)
    rows["tick_ns"] = np.arange(4) * 100 * MS
    rows["rank"], rows["peer"], rows["comm"], rows["dir"] = 4, 8, DP[0], SEND
    rows["seq"], rows["total"] = 7, 64
    rows["gpu_ready"], rows["transmitted"], rows["done"] = 30, 10, 10
    late = _with_recv(rows, posted=64)[4:][2:]  # its recv seen from 200 ms on
    (waits,) = flow_features(np.concatenate([rows[:2], late]))
    assert waits.gt_chunks == 0.0 and waits.wait_chunks == 20.0
    other = _with_recv(rows, posted=64)[4:]
    other["seq"] = 6  # the receiver reports an earlier op only
    (unissued,) = flow_features(np.concatenate([rows, other]))
    assert unissued.gt_chunks == 0.0 and unissued.wait_chunks == 20.0
    ahead = _with_recv(rows[:1], posted=32, lead_ns=0)
    ahead["transmitted"][1] = 26  # 16 chunks arrived after the sender's look
    (part,) = flow_features(ahead)
    assert part.gt_chunks == 6.0 and part.wait_chunks == 14.0


def test_with_hosts_a_cross_host_flows_gaps_are_its_ranks_in_the_op():
    """Per op, the median over every cross-host send of the rank (channels
    and snapshots together), as the role's baseline learns it: under credits
    a busy channel holds posted slots while an idle one holds none."""
    rows = np.zeros(8, dtype=FLAT_FLOW)
    rows["tick_ns"] = np.repeat(np.arange(4) * 100 * MS, 2)
    rows["rank"], rows["peer"], rows["comm"], rows["dir"] = 4, 8, DP[0], SEND
    rows["channel"] = np.tile([0, 1], 4)
    rows["seq"] = np.repeat([0, 0, 1, 1], 2)
    rows["total"], rows["gpu_ready"], rows["transmitted"] = 64, 40, 40
    rows["done"] = np.where(rows["channel"] == 0, 40, 10)  # channel 1 in flight
    alone = {f.channel: f.td_chunks for f in flow_features(rows)}
    assert alone == {0: 0.0, 1: 30.0}
    host = np.arange(16) // PER_HOST  # ranks 4 and 8 on different hosts
    pooled = flow_features(rows, host)
    assert [f.td_chunks for f in pooled] == [15.0, 15.0]
    same = np.zeros(16, dtype=np.int64)  # one host: each flow its own
    assert {f.channel: f.td_chunks for f in flow_features(rows, same)} == alone
