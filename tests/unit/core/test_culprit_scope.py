"""Culprits name the NIC, host or link the evidence points at."""

from __future__ import annotations

from mycroft.producers.sim.config import Hardware, SimConfig
from mycroft.producers.sim.engine import simulate
from mycroft.producers.sim.faults import parse_spec
from mycroft.schemas.records import Culprit, RankTopology, Topology
from mycroft.schemas.vocab import Component, FaultKind
from mycroft.streams.analyze import Replay
from mycroft.streams.core.culprit_scope import scope_culprits
from mycroft.streams.core.rca_config import DEFAULT_RCA
from mycroft.streams.core.topology import JobTopology


def _topo() -> JobTopology:
    """Two hosts of 4 GPUs, two GPUs per NIC."""
    topo = JobTopology()
    for h in range(2):
        ranks = tuple(
            RankTopology(r, r % 4, f"gpu{r % 4}", f"mlx5_{(r % 4) // 2}")
            for r in range(4 * h, 4 * h + 4)
        )
        topo.add(Topology("j", f"node{h}", f"10.0.0.{h}", 0, ranks))
    return topo


def _c(rank: int, comp: Component, conf: float, peer: int | None = None) -> Culprit:
    return Culprit(rank, f"node{rank // 4}", comp, FaultKind.HANG, conf, peer=peer)


def test_a_nic_tie_becomes_one_nic_culprit() -> None:
    out = scope_culprits(
        [
            _c(5, Component.NIC, 0.39, peer=1),
            _c(4, Component.NIC, 0.39),
            _c(1, Component.GPU, 0.1),
        ],
        _topo(),
    )
    nic, gpu = out
    assert (nic.scope, nic.device, nic.host, nic.ranks) == (
        "nic",
        "mlx5_0",
        "node1",
        (4, 5),
    )
    assert nic.rank == 5 and nic.peer == 1 and nic.confidence == 0.78  # strongest first
    assert nic.subject() == "NIC mlx5_0 of node1 (ranks 4, 5)"
    assert (gpu.scope, gpu.rank, gpu.subject()) == ("rank", 1, "rank 1 on node0")


def test_nics_of_one_host_stay_apart_and_confidence_is_capped() -> None:
    out = scope_culprits(
        [
            _c(4, Component.NIC, 0.8),
            _c(6, Component.NIC, 0.5),
            _c(5, Component.NIC, 0.7),
        ],
        _topo(),
    )
    assert [(c.device, c.ranks) for c in out] == [
        ("mlx5_0", (4, 5)),
        ("mlx5_1", (6, 7)),
    ]
    assert out[0].confidence == DEFAULT_RCA.max_confidence


def test_host_and_link_culprits() -> None:
    out = scope_culprits(
        [
            _c(2, Component.HOST, 0.4),
            _c(3, Component.HOST, 0.2),
            _c(6, Component.NETWORK, 0.3, peer=1),
        ],
        _topo(),
    )
    host, link = out
    assert (host.scope, host.ranks, host.subject()) == (
        "host",
        (0, 1, 2, 3),
        "host node0 (ranks 0-3)",
    )
    assert (link.scope, link.subject()) == ("link", "link 6 -> 1 (node1)")


def test_a_nic_without_topology_stays_a_rank() -> None:
    (c,) = scope_culprits([_c(9, Component.NIC, 0.5)], _topo())
    assert c.scope == "rank" and c.ranks == ()


def test_a_simulated_nic_fault_names_the_nic() -> None:
    """Two GPUs per NIC: the NIC that stops is named, with both its ranks."""
    cfg = SimConfig(
        tp=4, pp=2, dp=2, duration_s=14.0, seed=2, hardware=Hardware(gpus_per_nic=2)
    )
    rp = Replay()
    simulate(cfg, [parse_spec("nic-down:at=5")], rp)
    _, causes = rp.finish()
    (rc,) = causes.values()
    best = rc.culprits[0]
    assert best.scope == "nic" and best.component is Component.NIC
    assert best.device is not None and best.device.startswith("mlx5_")
    assert len(best.ranks) == 2 and best.rank in best.ranks
    assert all(c.scope != "nic" or len(c.ranks) == 2 for c in rc.culprits)


def test_one_rank_s_host_evidence_names_the_rank_not_its_host() -> None:
    """A host-wide verdict only when the evidence is host-wide: one rank that
    never issued its op is that rank (component ``host``), not every rank of
    its host."""
    (only,) = scope_culprits([_c(2, Component.HOST, 0.9)], _topo())
    assert (only.scope, only.rank, only.component, only.ranks) == (
        "rank",
        2,
        Component.HOST,
        (),
    )
    assert only.subject() == "rank 2 on node0"
    alone = JobTopology()
    alone.add(Topology("j", "solo", "10.0.0.9", 0, (RankTopology(0, 0, "gpu0", ""),)))
    (c,) = scope_culprits(
        [Culprit(0, "solo", Component.HOST, FaultKind.HANG, 0.9)], alone
    )
    assert (c.scope, c.ranks) == ("host", (0,))
