"""Wait chains across groups: crash suspects, idle ranks, order cycles.

Eight ranks: the world group ``0`` and two sub-groups, ``1`` (ranks 0-3) and
``2`` (ranks 4-7).
"""

from __future__ import annotations

from mycroft.schemas.vocab import Component
from mycroft.streams.core.wait_chain import WaitState, follow

WORLD, LOW, HIGH = tuple(range(8)), (0, 1, 2, 3), (4, 5, 6, 7)
MEMBERS = {"0": WORLD, "1": LOW, "2": HIGH}
OPS = {("0", 9): "all_reduce", ("1", 4): "all_gather", ("2", 4): "broadcast"}


def state(
    issued: dict[tuple[int, str], int],
    open_ops: dict[int, tuple[tuple[str, int], ...]],
    no_dump: frozenset[int] = frozenset(),
) -> WaitState:
    return WaitState(MEMBERS, issued, open_ops, no_dump, OPS)


def progress(world: int, low: int, high: int) -> dict[tuple[int, str], int]:
    out = {(r, "0"): world for r in WORLD}
    out |= {(r, "1"): low for r in LOW} | {(r, "2"): high for r in HIGH}
    return out


def test_crash_in_a_subgroup_with_the_world_waiting_behind_it() -> None:
    issued = progress(9, 4, 4)
    for r in LOW:  # group 1 is stuck in #5 before the world's #10
        issued[(r, "0")] = 8
    for r in (3,):  # rank 3 died: no dump at all
        del issued[(r, "0")], issued[(r, "1")]
    open_ops = {r: (("1", 4),) for r in (0, 1, 2)}
    open_ops |= {r: (("0", 9),) for r in HIGH}
    causes = follow(state(issued, open_ops, frozenset({3})))
    assert [(c.rank, c.component) for c in causes] == [(3, Component.PROCESS)]
    assert causes[0].waiting == (0, 1, 2, 4, 5, 6, 7)
    assert "all_gather #5 of group 1" in causes[0].evidence


def test_idle_rank_that_never_issued_is_host() -> None:
    issued = progress(9, 4, 4)
    issued[(6, "0")] = 8
    open_ops = {r: (("0", 9),) for r in WORLD if r != 6}
    causes = follow(state(issued, open_ops))
    assert [(c.rank, c.component) for c in causes] == [(6, Component.HOST)]
    assert causes[0].waiting == (0, 1, 2, 3, 4, 5, 7)


def test_idle_rank_behind_a_subgroup_is_followed() -> None:
    issued = progress(9, 4, 4)
    for r in HIGH:
        issued[(r, "0")] = 8
    issued[(5, "2")] = 3  # rank 5 never issued group 2's #5
    open_ops = {r: (("0", 9),) for r in LOW}
    open_ops |= {r: (("2", 4),) for r in (4, 6, 7)}
    causes = follow(state(issued, open_ops))
    assert [(c.rank, c.component) for c in causes] == [(5, Component.HOST)]
    assert causes[0].waiting == (0, 1, 2, 3, 4, 6, 7)


def test_order_cycle_across_groups_is_config_with_both_orders() -> None:
    members = {"1": (0, 1), "2": (0, 1)}
    ops = {("1", 0): "all_reduce", ("2", 0): "all_gather"}
    issued = {(0, "1"): 0, (1, "2"): 0}  # each issued a different group first
    open_ops = {0: (("1", 0),), 1: (("2", 0),)}
    causes = follow(WaitState(members, issued, open_ops, frozenset(), ops))
    assert [(c.rank, c.component, c.cycle) for c in causes] == [
        (0, Component.CONFIG, (0, 1))
    ]
    text = causes[0].evidence
    assert (
        "rank 0 issued all_reduce #1 of group 1 before all_gather #1 of group 2" in text
    )
    assert (
        "rank 1 issued all_gather #1 of group 2 before all_reduce #1 of group 1" in text
    )


def test_cycle_with_an_exit_ends_at_the_exit() -> None:
    members = {"1": (0, 1), "2": (0, 1), "3": (1, 2)}
    issued = {(0, "1"): 0, (1, "2"): 0, (1, "3"): 0}
    open_ops = {0: (("1", 0),), 1: (("2", 0), ("3", 0))}
    causes = follow(WaitState(members, issued, open_ops, frozenset({2}), {}))
    assert [(c.rank, c.component) for c in causes] == [(2, Component.PROCESS)]


def test_nothing_blocked_names_nobody() -> None:
    assert follow(state(progress(9, 4, 4), {})) == []


def test_all_arrived_op_waits_on_nobody() -> None:
    open_ops = {r: (("0", 9),) for r in WORLD}  # a device or network hang
    assert follow(state(progress(9, 4, 4), open_ops)) == []


def test_recv_waits_on_its_peer() -> None:
    """Rank 4 sits in a recv from rank 7 that rank 7 never sent: rank 7 waits
    in the world's #10, which rank 4 never issued. The recv's peer is
    followed (not group progress) and the two wait in a cycle."""
    issued = progress(9, 4, 4)
    issued[(4, "0")] = 8
    p2p = ("2/p2p", 0)
    open_ops = {r: (("0", 9),) for r in WORLD if r != 4} | {4: (p2p,)}
    s = WaitState(MEMBERS, issued, open_ops, frozenset(), OPS, {(4, *p2p): (7,)})
    causes = follow(s)
    assert [(c.rank, c.component, c.cycle) for c in causes] == [
        (4, Component.CONFIG, (4, 7))
    ]


def test_recv_from_an_idle_peer_is_host() -> None:
    members = {"0": (0, 1, 2)}
    issued = {(0, "0"): 5, (1, "0"): 4, (2, "0"): 4}
    p2p = ("0/p2p", 3)
    open_ops = {0: (("0", 5),), 1: (p2p,), 2: ()}
    s = WaitState(members, issued, open_ops, frozenset(), {}, {(1, *p2p): (2,)})
    assert [(c.rank, c.component) for c in follow(s)] == [(2, Component.HOST)]


def test_send_and_recv_that_met_wait_on_nobody() -> None:
    members = {"0": (0, 1)}
    open_ops = {0: (("0/p2p", 0),), 1: (("0/p2p", 0),)}
    peer_waits = {(0, "0/p2p", 0): (), (1, "0/p2p", 0): ()}
    s = WaitState(members, {}, open_ops, frozenset(), {}, peer_waits)
    assert follow(s) == []
