"""``detect_wire``: a part whose transfers stay slowed on the wire is a
slowdown, though no op may slow."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mycroft.schemas.records import Anomaly
from mycroft.schemas.vocab import SEND, Component, FaultKind
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.detect_wire import detect_slow_wire
from mycroft.streams.core.progress import ProgressStore
from mycroft.streams.core.rca_slow import explain_slowdown
from mycroft.streams.core.rca_transfers import (
    score_transfers,
    score_uplinks,
    wire_view,
)
from mycroft.streams.core.suspect import Suspects
from mycroft.streams.core.topology import JobTopology
from mycroft.streams.core.transfer_times import Scope, Side
from tests.unit.core.test_slow_rules import MS, _stat
from tests.unit.core.test_transfer_times import _batch

PER_HOST, HOSTS = 4, 6
SEC = 1_000_000_000
SENDS_PER_S = 4
BASE_NS = 400  # wire time per chunk of a healthy transfer


def _ctx(cfg: DetectorConfig | None = None) -> DetectContext:
    """Six hosts of four GPUs, two per NIC."""
    cfg = cfg or DetectorConfig()
    topo = JobTopology()
    for r in range(PER_HOST * HOSTS):
        topo.rank_host[r] = f"h{r // PER_HOST}"
        topo.rank_nic[r] = f"nic{(r % PER_HOST) // 2}"
        topo.rank_gpu[r] = f"gpu{r % PER_HOST}"
    store = ProgressStore(cfg.history_ns, (cfg.transfer_rows_per_rank, 1 << 14))
    return DetectContext("j", store, topo, BaselineBook(64), cfg)


def _second(ctx: DetectContext, s: int, slow: dict[int, float]) -> None:
    """Second ``s`` of a ring across hosts (rank r sends to r + 4): each pair
    sends ``SENDS_PER_S`` times; a pair touching a host in ``slow`` spends
    that factor more per chunk on the wire."""
    n = PER_HOST * HOSTS
    for k in range(SENDS_PER_S):
        t = s * SEC + k * SEC // SENDS_PER_S
        for r in range(n):
            peer = (r + PER_HOST) % n
            f = max(slow.get(r // PER_HOST, 1.0), slow.get(peer // PER_HOST, 1.0))
            wire = int(4 * BASE_NS * f)
            ctx.store.transfers.add(
                *_batch(r, "send", [(peer, SEND, 4, t, t + 500, wire)])
            )


def _run(ctx: DetectContext, seconds: range, slow: dict[int, float]) -> list[list[str]]:
    """Feed each second, then check at its end; the anomaly ids per check."""
    return [[a.anomaly_id for a in found] for found in _checks(ctx, seconds, slow)]


def _checks(
    ctx: DetectContext, seconds: range, slow: dict[int, float]
) -> list[list[Anomaly]]:
    out = []
    for s in seconds:
        _second(ctx, s, slow)
        out.append(detect_slow_wire(ctx, (s + 1) * SEC))
    return out


def test_a_host_whose_transfers_all_slow_is_a_slowdown_after_its_persistence() -> None:
    ctx = _ctx()
    assert _run(ctx, range(6), {}) == [[]] * 6
    found = _run(ctx, range(6, 12), {2: 2.0})
    # checks at 7 s (half its window slowed), then 8, 9 and 10 s: the third
    # in a row fires, and the anomaly keeps its id while the host stays slow
    assert found[:3] == [[], [], []]
    assert found[3] and all(f == found[3] for f in found[3:])
    (a,) = _checks(ctx, range(12, 13), {2: 2.0})[0]
    assert a.kind is FaultKind.SLOWDOWN and a.detector == "slow_wire"
    assert a.ranks == (8, 9, 10, 11)
    assert a.onset_ns == 8 * SEC  # the first check that found it slowed
    assert "8 of 8 transfers through host" in a.summary


def test_checks_run_once_a_second_of_event_time() -> None:
    ctx = _ctx()
    _run(ctx, range(6), {})
    _run(ctx, range(6, 10), {2: 2.0})
    _second(ctx, 10, {2: 2.0})
    assert detect_slow_wire(ctx, 11 * SEC + 1)  # a new second: checked
    assert detect_slow_wire(ctx, 11 * SEC + SEC // 2) == []  # the same second


@pytest.mark.parametrize(
    ("slow", "why"),
    [
        ({h: 2.0 for h in range(HOSTS)}, "every pair slower: the job's change"),
        ({2: 1.3}, "below the slowed ratio"),
    ],
)
def test_no_part_stands_out_no_anomaly(slow: dict[int, float], why: str) -> None:
    ctx = _ctx()
    _run(ctx, range(6), {})
    assert _run(ctx, range(6, 12), slow) == [[]] * 6, why


def test_a_burst_shorter_than_the_persistence_is_not_an_anomaly() -> None:
    ctx = _ctx()
    _run(ctx, range(6), {})
    found = _run(ctx, range(6, 7), {2: 3.0}) + _run(ctx, range(7, 14), {})
    assert found == [[]] * 8


@pytest.mark.parametrize(
    "senders",
    [
        (8,),  # one slowed pair: no part shared by two
        (8, 9),  # two, through one NIC: log-likelihood 4.2, below the alarm
    ],
)
def test_too_few_slowed_pairs_are_no_alarm(senders: tuple[int, ...]) -> None:
    ctx = _ctx()
    _run(ctx, range(6), {})
    for s in range(6, 12):  # their sends 4x
        for k in range(SENDS_PER_S):
            t = s * SEC + k * SEC // SENDS_PER_S
            for r in range(PER_HOST * HOSTS):
                peer = (r + PER_HOST) % (PER_HOST * HOSTS)
                wire = 4 * BASE_NS * (4 if r in senders else 1)
                ctx.store.transfers.add(
                    *_batch(r, "send", [(peer, SEND, 4, t, t + 500, wire)])
                )
        assert detect_slow_wire(ctx, (s + 1) * SEC) == []


def test_the_alarm_needs_more_evidence_when_configured_so() -> None:
    ctx = _ctx(DetectorConfig(wire_alarm_llr=40.0))
    _run(ctx, range(6), {})
    assert _run(ctx, range(6, 12), {2: 2.0}) == [[]] * 6


def test_a_job_whose_producers_time_nothing_has_no_wire_check() -> None:
    ctx = _ctx()
    assert detect_slow_wire(ctx, SEC) == []
    assert np.array_equal(ctx.store.transfers.kept(), ctx.store.transfers.rows[:0])


def test_root_cause_names_the_part_the_wire_check_alarms_on() -> None:
    """Two GPUs share each NIC, so root cause's margin hides a pair slowed
    1.8x; every pair of host 2 slowed so is what the wire check alarms on,
    and root cause then names it as well: its host, the network."""
    ctx = _ctx()
    _run(ctx, range(6), {})
    found = _run(ctx, range(6, 12), {2: 1.8})
    assert found[-1], "the wire check alarms"
    suspects = Suspects(ctx.cfg.rca)
    wire = wire_view(ctx, 8 * SEC)
    named = score_transfers(suspects, wire)
    assert named == [] and not suspects  # within the margin
    assert score_uplinks(suspects, wire, math.inf, named) == []
    parts = score_uplinks(suspects, wire, ctx.cfg.wire_alarm_llr, named)
    assert [(p.scope, p.side, p.key) for p in parts] == [(Scope.HOST, Side.BOTH, 2)]
    (rank,) = suspects
    assert rank in range(8, 12)
    assert suspects[rank].best[0] is Component.NETWORK


@pytest.mark.parametrize("late_ms", [0, 50])
def test_a_host_slowed_on_the_wire_is_its_network_unless_its_ranks_are_late(
    late_ms: int,
) -> None:
    """With nobody late, root cause reads host 2's transfers, all 1.8x, as
    the wire check did: its network. When host 2's ranks arrive late, a GPU
    that computes slowly also copies slowly and stretches its transfers
    within the margin: the uplink reading is not made."""
    ctx = _ctx()
    _run(ctx, range(6), {})
    _run(ctx, range(6, 12), {2: 1.8})
    ranks = list(range(PER_HOST * HOSTS))
    stats = [
        _stat(0x100, seq, ranks, [
            8 * SEC + seq * 100 * MS + (late_ms * MS if r // PER_HOST == 2 else 0)
            for r in ranks
        ], [MS] * len(ranks))
        for seq in range(20)
    ]  # fmt: skip
    culprits, _ = explain_slowdown(ctx, stats, 8 * SEC)
    network = [c for c in culprits if c.component is Component.NETWORK]
    if late_ms:
        assert not network
    else:
        assert network and network[0].rank in range(8, 12)
