"""``transfer_times``: the ring of point-to-point transfers and the parts
their slowdowns point at."""

from __future__ import annotations

import numpy as np
import pytest

from mycroft.schemas.columns import DONE_FLOW_COLUMNS, DONE_OP_COLUMNS, empty
from mycroft.schemas.records import RankTopology, Topology
from mycroft.schemas.vocab import OP_NAMES, RECV, SEND
from mycroft.streams.core.rca_config import RcaConfig
from mycroft.streams.core.rca_transfers import wire_view
from mycroft.streams.core.topology import JobTopology
from mycroft.streams.core.transfer_times import (
    TIMES,
    PairChanges,
    PairMedians,
    Scope,
    Side,
    TransferTimes,
    nic_share,
    pair_changes,
    slow_parts,
)
from tests.unit.core.test_slow_rules import _ctx as hosts_ctx

RCA = RcaConfig()
ONSET = 1_000_000_000


def _batch(
    rank: int, kind: str, flows: list[tuple[int, int, int, int, int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """One op of ``rank``, flows ``(peer, dir, chunks, first_ns, last_ns, wire_ns)``."""
    op = empty(DONE_OP_COLUMNS, 1)
    op["rank"], op["kind"], op["nflows"] = rank, OP_NAMES.index(kind), len(flows)
    fl = empty(DONE_FLOW_COLUMNS, len(flows))
    for i, (peer, d, chunks, first, last, wire) in enumerate(flows):
        fl[i]["channel"], fl[i]["peer"], fl[i]["dir"] = i, peer, d
        fl[i]["chunks"], fl[i]["first_ns"], fl[i]["last_ns"] = chunks, first, last
        fl[i]["wire_ns"] = wire
    return op, fl


def test_a_timed_send_is_one_row_per_op_and_peer_its_channels_merged() -> None:
    times = TransferTimes(8)
    flows = [
        (9, SEND, 4, 100, 900, 300),
        (5, SEND, 2, 150, 700, 100),
        (9, SEND, 4, 300, 1700, 500),
        (9, RECV, 4, 100, 900, 0),  # receive flows carry no wire time
        (7, SEND, 4, 100, 900, 0),  # not timed (a flow within a host)
    ]
    times.add(*_batch(3, "allreduce", flows))
    rows = times.kept()
    got = [(int(r["peer"]), int(r["first_ns"]), int(r["last_ns"])) for r in rows]
    assert sorted(got) == [(5, 150, 700), (9, 100, 1700)]
    nine = rows[rows["peer"] == 9][0]
    assert nine["log_ns"] == pytest.approx(np.log(800 / 8))


def test_the_ring_keeps_the_latest_rows_oldest_first() -> None:
    times = TransferTimes(2)  # two ranks seen: 4 rows
    for t in range(6):
        times.add(*_batch(3, "send", [(9, SEND, 1, t, t + 10, 5)]))
    assert times.kept()["first_ns"].tolist() == [2, 3, 4, 5]


def test_the_ring_grows_with_the_ranks_it_sees_keeping_what_it_held() -> None:
    times = TransferTimes(1)
    times.add(*_batch(0, "send", [(1, SEND, 1, 0, 10, 5)]))
    times.add(*_batch(1, "send", [(0, SEND, 1, 1, 11, 5)]))
    assert len(times.rows) == 2  # ranks 0 and 1
    times.add(*_batch(2, "send", [(3, SEND, 1, 2, 12, 5), (0, SEND, 1, 2, 12, 5)]))
    assert len(times.rows) == 4  # ranks 0-3
    assert times.kept()["first_ns"].tolist() == [0, 1, 2, 2]
    times.add(*_batch(3, "send", [(2, SEND, 1, 3, 13, 5)]))
    assert len(times.rows) == 4
    assert times.kept()["first_ns"].tolist() == [1, 2, 2, 3]


def test_the_ring_never_holds_fewer_rows_than_its_floor() -> None:
    times = TransferTimes(1, least=3)
    for t in range(4):
        times.add(*_batch(0, "send", [(1, SEND, 1, t, t + 10, 5)]))
    assert len(times.rows) == 3  # two ranks seen, but at least 3 rows
    assert times.kept()["first_ns"].tolist() == [1, 2, 3]


def _rows(pairs: dict[tuple[int, int], tuple[float, float]], n: int = 4) -> np.ndarray:
    """``n`` transfers per pair before the onset and ``n`` after, at the
    given times per chunk (ns)."""
    out = []
    for (r, p), (before, after) in pairs.items():
        for i in range(n):
            out.append((r, p, i * 1000, i * 1000 + 10, np.log(before)))
            t = ONSET + i * 1000
            out.append((r, p, t, t + 10, np.log(after)))
    return np.array(out, dtype=TIMES)


def test_a_pair_is_slowed_against_its_own_history_net_of_the_job() -> None:
    # Every pair 2x slower (a slower phase), one 6x: only that one is slowed.
    rows = _rows(
        {(0, 8): (10, 20), (1, 9): (50, 100), (2, 10): (10, 60), (3, 11): (7, 14)}
    )
    ch = pair_changes(rows, ONSET, RCA)
    assert list(
        zip(ch.rank.tolist(), ch.peer.tolist(), ch.slowed.tolist(), strict=True)
    ) == [
        (0, 8, False),
        (1, 9, False),
        (2, 10, True),
        (3, 11, False),
    ]
    assert ch.change[2] == pytest.approx(np.log(3))


def test_a_job_that_got_faster_on_the_wire_does_not_slow_its_unchanged_pairs() -> None:
    # A stall elsewhere leaves the job's flows sending less at once: most
    # pairs move data faster than before. A pair whose time is unchanged
    # (1.4x) is not slowed by the others speeding up; the 3x pair is, by its
    # own change.
    rows = _rows(
        {(0, 8): (10, 5), (1, 9): (10, 5), (2, 10): (10, 5), (3, 11): (10, 14)}
        | {(4, 12): (10, 30)}
    )
    ch = pair_changes(rows, ONSET, RCA)
    assert dict(zip(ch.rank.tolist(), ch.slowed.tolist(), strict=True)) == {
        0: False,
        1: False,
        2: False,
        3: False,
        4: True,
    }
    assert ch.change[4] == pytest.approx(np.log(3))


def test_a_pair_through_a_shared_nic_is_slowed_only_beyond_its_share() -> None:
    # Ranks 0 and 1 share a NIC, the others do not: 1.8x on a pair through
    # the shared NIC is what its mate sending at once costs; 2.5x is more.
    share = nic_share(np.array([0, 0, 1, 2, -1, -1, -1, -1, 3, 4]))
    assert share.tolist() == [2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    even = {(r, p): (10.0, 10.0) for r in (2, 3, 5) for p in (8, 9)}
    rows = _rows(even | {(0, 8): (10, 18), (1, 9): (10, 25), (3, 7): (10, 18)})

    def slowed(share: np.ndarray | None) -> set[tuple[int, int]]:
        ch = pair_changes(rows, ONSET, RCA, share)
        pairs = zip(ch.rank, ch.peer, ch.slowed, strict=True)
        return {(int(r), int(p)) for r, p, s in pairs if s}

    assert slowed(share) == {(1, 9), (3, 7)}
    assert slowed(None) == {(0, 8), (1, 9), (3, 7)}


def test_the_history_before_an_onset_outlives_the_ring() -> None:
    # An 8-row ring (4 ranks): once both pairs have sent 4 times after the
    # onset it no longer holds a send before it. The history read at the
    # first look still measures the change: pair 0->8 went 6x slower.
    times = TransferTimes(2)

    def send(t: int, slow: int) -> None:
        times.add(*_batch(0, "send", [(8, SEND, 1, t, t + 10, 10 * slow)]))
        times.add(*_batch(1, "send", [(9, SEND, 1, t, t + 10, 10)]))

    for i in range(3):
        send(i * 1000, 1)
    send(ONSET, 6)
    assert times.before(ONSET).count.tolist() == [3, 3]
    for i in range(1, 4):
        send(ONSET + i * 1000, 6)
    rows = times.kept()
    assert len(rows) == 8 and (rows["first_ns"] >= ONSET).all()
    assert len(pair_changes(rows, ONSET, RCA).rank) == 0  # the ring alone
    ch = pair_changes(rows, ONSET, RCA, before=times.before(ONSET))
    assert ch.rank.tolist() == [0, 1] and ch.slowed.tolist() == [True, False]
    assert times.before(ONSET).count.tolist() == [3, 3]  # kept, not re-read
    assert len(times.before(ONSET - 1).key) == 0  # another onset: the ring's


def test_a_later_look_at_an_onset_keeps_per_pair_the_reading_with_more_sends() -> None:
    held = PairMedians(np.array([1, 2]), np.array([5, 2]), np.array([1.0, 2.0]))
    now = PairMedians(np.array([2, 3]), np.array([4, 1]), np.array([2.5, 3.0]))
    got = held.merge(now)
    assert got.key.tolist() == [1, 2, 3]
    assert got.count.tolist() == [5, 4, 1]
    assert got.median.tolist() == [1.0, 2.5, 3.0]


def test_a_pair_without_enough_history_is_not_judged() -> None:
    rows = _rows({(0, 8): (10, 60)}, n=RCA.transfer_min_before - 1)
    assert len(pair_changes(rows, ONSET, RCA).rank) == 0


def _changes(
    slowed: list[tuple[int, int]], clean: list[tuple[int, int]]
) -> PairChanges:
    pairs = slowed + clean
    return PairChanges(
        np.array([r for r, _ in pairs]),
        np.array([p for _, p in pairs]),
        np.array([1.0] * len(slowed) + [0.0] * len(clean)),
        np.array([True] * len(slowed) + [False] * len(clean)),
    )


# 4 hosts of 4 ranks, 2 ranks per NIC: rank r on host r // 4, NIC r // 2.
HOST_OF = np.arange(16) // 4
NIC_OF = np.arange(16) // 2
# The pipeline's cross-host pairs: rank r sends to r + 4 and receives from it.
PAIRS = [(r, r + 4) for r in range(12)] + [(r + 4, r) for r in range(12)]


def _others(*slowed: tuple[int, int]) -> list[tuple[int, int]]:
    return [p for p in PAIRS if p not in slowed]


def test_both_ranks_of_a_nic_sending_slowly_name_the_nic() -> None:
    slowed = [(4, 8), (5, 9), (4, 0), (5, 1)]
    parts = slow_parts(_changes(slowed, _others(*slowed)), NIC_OF, HOST_OF, RCA)
    assert [(p.scope, p.side, p.ranks) for p in parts] == [
        (Scope.NIC, Side.SEND, (4, 5))
    ]


def test_one_rank_slow_both_ways_its_nic_mate_clean_names_its_path() -> None:
    slowed = [(4, 8), (8, 4), (4, 0), (0, 4)]
    parts = slow_parts(_changes(slowed, _others(*slowed)), NIC_OF, HOST_OF, RCA)
    assert {(p.scope, p.ranks[0]) for p in parts} == {(Scope.RANK, 4)}


def test_one_slowed_pair_whose_ends_both_move_other_pairs_names_nothing() -> None:
    # Rank 4 sends to rank 0 as before, rank 8 receives from rank 12 as
    # before: either end could hold the one slowed pair.
    slowed = [(4, 8)]
    assert slow_parts(_changes(slowed, _others(*slowed)), NIC_OF, HOST_OF, RCA) == []


def test_one_slowed_pair_whose_ends_carry_nothing_else_names_nothing() -> None:
    slowed = [(4, 8)]
    assert slow_parts(_changes(slowed, [(6, 10)]), NIC_OF, HOST_OF, RCA) == []


def test_one_slowed_pair_into_a_rank_fed_by_no_one_else_names_its_path() -> None:
    # Rank 4 sends to rank 0 as before and rank 8's NIC mate receives as
    # before; rank 8 receives from rank 4 only: its own path is left.
    slowed = [(4, 8)]
    parts = slow_parts(
        _changes(slowed, [(4, 0), (13, 9), (5, 1)]), NIC_OF, HOST_OF, RCA
    )
    assert [(p.scope, p.side, p.ranks) for p in parts] == [
        (Scope.RANK, Side.RECV, (8,))
    ]


def test_one_slowed_pair_from_a_sender_that_stopped_names_nothing() -> None:
    # The same pair as above, its sender's transport seen standing still:
    # a stopped send proxy observes its in-flight sends done late.
    slowed = [(4, 8)]
    changes = _changes(slowed, [(4, 0), (13, 9), (5, 1)])
    assert slow_parts(changes, NIC_OF, HOST_OF, RCA, lambda: frozenset({4})) == []


def test_one_slowed_pair_into_a_rank_alone_on_its_nic_names_nothing() -> None:
    # Its path and its NIC carry the same pair: one pair cannot tell them
    # apart (two or more name the NIC, below).
    nic_of = np.arange(16)
    slowed = [(4, 8)]
    parts = slow_parts(_changes(slowed, [(4, 0), (13, 9)]), nic_of, HOST_OF, RCA)
    assert parts == []


def test_a_rank_alone_on_its_nic_is_named_by_its_nic() -> None:
    nic_of = np.arange(
        16
    )  # one rank per NIC: its path and its NIC carry the same pairs
    slowed = [(4, 8), (4, 0)]
    parts = slow_parts(_changes(slowed, _others(*slowed)), nic_of, HOST_OF, RCA)
    assert [(p.scope, p.side, p.ranks) for p in parts] == [(Scope.NIC, Side.SEND, (4,))]


def test_pairs_within_a_host_cross_no_nic() -> None:
    slowed = [(4, 5), (4, 6), (4, 7)]
    assert slow_parts(_changes(slowed, PAIRS), NIC_OF, HOST_OF, RCA) == []


def test_the_two_ends_of_one_link_tie_and_are_both_named() -> None:
    # Both ranks of NIC 2 send slowly to both ranks of NIC 4, which receive
    # from nobody else: the sending NIC and the receiving one explain it
    # alike (their hosts' other NICs are clean).
    slowed = [(4, 8), (5, 9)]
    parts = slow_parts(_changes(slowed, [(6, 10), (7, 11)]), NIC_OF, HOST_OF, RCA)
    assert {(p.side, p.ranks) for p in parts} == {
        (Side.SEND, (4, 5)),
        (Side.RECV, (8, 9)),
    }


def test_a_host_slowed_both_ways_is_named_over_the_hosts_it_talks_to() -> None:
    # A ring of hosts: rank r sends to r - 4. Host 1's uplink is congested:
    # what it sends (to host 0) and what it receives (from host 2) slow down.
    # One way each, host 0's receiving side and host 2's sending side explain
    # as many pairs with none clean; both ways, only host 1 explains them.
    ring = [(r, (r - 4) % 16) for r in range(16)]
    slowed = [(r, p) for r, p in ring if 1 in (HOST_OF[r], HOST_OF[p])]
    clean = [pair for pair in ring if pair not in slowed]
    parts = slow_parts(_changes(slowed, clean), NIC_OF, HOST_OF, RCA)
    assert [(p.scope, p.side, p.key, p.slowed) for p in parts] == [
        (Scope.HOST, Side.BOTH, 1, 8)
    ]


def test_a_part_carrying_traffic_one_way_is_named_by_that_side() -> None:
    # Rank 4 only sends across hosts: its two-way reading is its send side.
    slowed = [(4, 8), (4, 0)]
    parts = slow_parts(_changes(slowed, [(6, 10), (7, 11)]), NIC_OF, HOST_OF, RCA)
    assert Side.BOTH not in {p.side for p in parts}


def test_config_rejects_noise_above_the_fault_rate() -> None:
    with pytest.raises(ValueError, match="transfer_p_noise"):
        RcaConfig(transfer_p_noise=0.6, transfer_p_fault=0.5)


def test_the_wire_view_is_pending_until_a_pair_is_timed_after_the_onset() -> None:
    """Until some pair has ``transfer_min_after`` sends after the onset the
    parts are not measured yet (a verdict then is provisional); a job whose
    producers time nothing has no view at all."""
    ctx = hosts_ctx()  # 4 hosts of 4 GPUs, 2 per NIC
    assert wire_view(ctx, ONSET) is None
    times = ctx.store.transfers
    for i in range(4):  # ranks 0 and 1 (one NIC) send to 4 and 5, before
        t = ONSET - (4 - i) * 1000
        times.add(*_batch(0, "send", [(4, SEND, 4, t, t + 500, 400)]))
        times.add(*_batch(1, "send", [(5, SEND, 4, t, t + 500, 400)]))
    view = wire_view(ctx, ONSET)
    assert view is not None and view.pending
    for i in range(RCA.transfer_min_after):  # after: 0 -> 4 and 1 -> 5 slowed 4x
        t = ONSET + i * 1000
        times.add(*_batch(0, "send", [(4, SEND, 4, t, t + 500, 1600)]))
        times.add(*_batch(1, "send", [(5, SEND, 4, t, t + 500, 1600)]))
    view = wire_view(ctx, ONSET)
    assert view is not None and not view.pending
    # the job's median change is taken out: two pairs both slowed are its
    # median, so nothing stands out until a third pair holds steady
    assert view.pairs.slowed_senders == frozenset()
    for i in range(4 + RCA.transfer_min_after):
        t = ONSET + (i - 4) * 1000
        times.add(*_batch(8, "send", [(12, SEND, 4, t, t + 500, 400)]))
        times.add(*_batch(9, "send", [(13, SEND, 4, t, t + 500, 400)]))
        times.add(*_batch(10, "send", [(14, SEND, 4, t, t + 500, 400)]))
    view = wire_view(ctx, ONSET)
    assert view is not None and view.pairs.slowed_senders == frozenset({0, 1})


def test_part_ids_follow_the_topology_as_hosts_report() -> None:
    topo = JobTopology()

    def host(name: str, ranks: list[int], nics: list[str]) -> Topology:
        rows = tuple(
            RankTopology(r, i, f"gpu{i}", nic)
            for i, (r, nic) in enumerate(zip(ranks, nics, strict=True))
        )
        return Topology("job", name, "10.0.0.1", 0, rows)

    topo.add(host("a", [0, 1], ["mlx5_0", "mlx5_0"]))
    nic_of, host_of = topo.part_ids(4)
    assert nic_of.tolist() == [0, 0, -1, -1] and host_of.tolist() == [0, 0, -1, -1]
    assert topo.part_ids(4)[0] is nic_of  # unchanged topology: the same arrays
    assert not nic_of.flags.writeable
    topo.add(host("b", [2, 3], ["mlx5_0", "mlx5_1"]))
    nic_of, host_of = topo.part_ids(4)
    assert nic_of.tolist() == [0, 0, 1, 2] and host_of.tolist() == [0, 0, 1, 1]
