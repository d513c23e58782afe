"""Small, valid instances of every record type for tests."""

from __future__ import annotations

from mycroft.schemas.columns import (
    DONE_FLOW_COLUMNS,
    DONE_OP_COLUMNS,
    FLOW_COLUMNS,
    OP_COLUMNS,
    RC_COLUMNS,
    empty,
)
from mycroft.schemas.records import (
    Anomaly,
    BatchHeader,
    ChannelTopology,
    CommMembership,
    CompletionBatch,
    Connection,
    Culprit,
    Evidence,
    Heartbeat,
    RankHealth,
    RankTopology,
    Record,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.schemas.vocab import Component, FaultKind

T0 = 1_767_225_600_000_000_000
COMM = 0xF00D_0000_0000_0001  # above 2**63: exercises the unsigned mapping


def header(seq: int = 0, host: str = "host-0") -> BatchHeader:
    return BatchHeader("job-1", host, T0, seq, T0 + seq * 100_000_000, 100)


def state_batch(seq: int = 0) -> StateBatch:
    rc = empty(RC_COLUMNS, 8)
    rc["rank"] = range(8)
    rc["comm"] = COMM
    rc["issued_seq"] = 5
    rc["done_seq"] = 4
    rc["seen_ns"] = T0
    op = empty(OP_COLUMNS, 8)
    op["rank"] = range(8)
    op["comm"] = COMM
    op["seq"] = 5
    op["bytes"] = 1 << 26
    op["nflows"] = 2
    flow = empty(FLOW_COLUMNS, 16)
    flow["channel"] = [0, 1] * 8
    flow["peer"] = [(r + 1) % 8 for r in range(8) for _ in range(2)]
    flow["total"] = 64
    flow["gpu_ready"] = 40
    flow["transmitted"] = 30
    flow["done"] = range(16)
    return StateBatch(header(seq), rc, op, flow)


def completion_batch() -> CompletionBatch:
    op = empty(DONE_OP_COLUMNS, 2)
    op["rank"] = [0, 1]
    op["comm"] = COMM
    op["seq"] = 4
    op["start_ns"] = T0
    op["end_ns"] = T0 + 30_000_000
    op["nflows"] = 1
    flow = empty(DONE_FLOW_COLUMNS, 2)
    flow["peer"] = [1, 0]
    flow["chunks"] = 64
    flow["wire_ns"] = [12_000_000, 0]  # rank 0's send timed, rank 1's not
    return CompletionBatch(header(), op, flow)


def topology() -> Topology:
    comm = CommMembership(
        comm=COMM,
        name="dp",
        nranks=2,
        comm_rank=0,
        ranks=(0, 1),
        channels=(ChannelTopology(0, 1, 1, -1, (1,)),),
        connections=(Connection(1, 0, "send", "net"), Connection(1, 0, "recv", "net")),
    )
    return Topology(
        "job-1",
        "host-0",
        "10.0.0.1",
        T0,
        (RankTopology(0, 0, "gpu0", "mlx5_0", (comm,)),),
    )


def all_records() -> list[Record]:
    hb = Heartbeat(
        "job-1",
        "host-0",
        T0,
        T0,
        100,
        1.5,
        10,
        9,
        1,
        0,
        0,
        0,
        (RankHealth(0, 123, T0, 2, 1),),
    )
    anomaly = Anomaly(
        "a-1",
        "job-1",
        FaultKind.HANG,
        (COMM,),
        (0, 1),
        T0,
        T0 + 1,
        "hang",
        "op 5 stuck",
    )
    rc = RootCause(
        "i-1",
        0,
        "job-1",
        FaultKind.HANG,
        (
            Culprit(
                3,
                "host-0",
                Component.NIC,
                FaultKind.HANG,
                0.9,
                peer=4,
                channel=1,
                reason="G>T frozen",
                rules=("frozen_ready_not_sent", "port_down"),
            ),
            Culprit(4, "host-0", Component.NETWORK, FaultKind.HANG, 0.1),
        ),
        (
            Evidence("rank 3 ch1->4 stuck", rank=3, comm=COMM, op_seq=5),
            Evidence("root"),
        ),
        ("a-1",),
        T0,
        T0 + 2_000_000_000,
        T0 + 2_500_000_000,
    )
    return [state_batch(), completion_batch(), hb, topology(), anomaly, rc]
