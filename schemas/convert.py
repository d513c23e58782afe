"""Conversions between record dataclasses and the Avro datum dicts."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from mycroft.errors import DecodeError
from mycroft.schemas.columns import COMPLETION_GROUPS, STATE_GROUPS, Group, empty
from mycroft.schemas.records import (
    Anomaly,
    BatchHeader,
    BlockedRank,
    BlockState,
    ChannelTopology,
    CommMembership,
    CommStatus,
    CommSummary,
    CompletionBatch,
    Connection,
    Culprit,
    Evidence,
    Heartbeat,
    NicPort,
    RankHealth,
    RankTopology,
    Record,
    RootCause,
    StateBatch,
    Topology,
)
from mycroft.schemas.vocab import Component, FaultKind, IncidentState

Datum = dict[str, Any]

_HEADER_FIELDS = (
    "job_id",
    "host",
    "agent_epoch",
    "agent_seq",
    "tick_ns",
    "interval_ms",
)
_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1


def _pack_groups(groups: dict[str, Group], arrays: dict[str, np.ndarray]) -> Datum:
    out: Datum = {}
    for g, columns in groups.items():
        arr = arrays[g]
        out[f"n_{g}"] = len(arr)
        for c in columns:
            if c.optional and not arr[c.name].any():
                # Zero on every row reads the same as absent: sent empty,
                # so writers that never measure it pay nothing for it.
                out[f"{g}_{c.name}"] = b""
                continue
            out[f"{g}_{c.name}"] = np.ascontiguousarray(
                arr[c.name], dtype=c.dtype
            ).tobytes()
    return out


@lru_cache(maxsize=16)
def _fields(group_name: str, columns: Group) -> tuple[tuple[str, str, np.dtype], ...]:
    """Per column of a group: its Avro field, its name and its dtype."""
    return tuple((f"{group_name}_{c.name}", c.name, np.dtype(c.dtype)) for c in columns)


def _unpack_group(group_name: str, columns: Group, datum: Datum) -> np.ndarray:
    n = datum[f"n_{group_name}"]
    if n < 0:
        raise DecodeError("invalid", f"n_{group_name} is negative ({n})")
    arr = empty(columns, n)
    for (field, name, dtype), col in zip(
        _fields(group_name, columns), columns, strict=True
    ):
        buf = datum.get(field, b"")
        if col.optional and not buf:
            continue  # absent (an older writer): the column stays zero
        want = n * dtype.itemsize
        if len(buf) != want:
            raise DecodeError(
                "invalid",
                f"column {field} holds {len(buf)} bytes, expected {want} for {n} rows",
            )
        arr[name] = np.frombuffer(buf, dtype=dtype)
    return arr


def _header_datum(h: BatchHeader) -> Datum:
    return {name: getattr(h, name) for name in _HEADER_FIELDS}


def _header(datum: Datum) -> BatchHeader:
    return BatchHeader(**{name: datum[name] for name in _HEADER_FIELDS})


def signed64(comm: int) -> int:
    """Map an unsigned 64-bit communicator hash to Avro's signed long."""
    return comm - _U64 if comm > _I64_MAX else comm


def unsigned64(comm: int) -> int:
    """Inverse of :func:`signed64`."""
    return comm + _U64 if comm < 0 else comm


def to_datum(record: Record) -> tuple[str, Datum]:  # noqa: PLR0911 - one case per type
    """Return ``(record type name, Avro datum)`` for a record."""
    match record:
        case StateBatch():
            arrays = {"rc": record.rc, "op": record.op, "flow": record.flow}
            datum = _header_datum(record.header) | _pack_groups(STATE_GROUPS, arrays)
            return "StateBatch", datum
        case CompletionBatch():
            arrays = {"op": record.op, "flow": record.flow}
            datum = _header_datum(record.header) | _pack_groups(
                COMPLETION_GROUPS, arrays
            )
            return "CompletionBatch", datum
        case Heartbeat():
            return "Heartbeat", _heartbeat_datum(record)
        case Topology():
            return "Topology", _topology_datum(record)
        case Anomaly():
            return "Anomaly", _anomaly_datum(record)
        case RootCause():
            return "RootCause", _rootcause_datum(record)
        case CommSummary():
            return "CommSummary", _summary_datum(record)
    raise TypeError(f"not a Mycroft record: {type(record).__name__}")


def from_datum(name: str, datum: Datum) -> Record:  # noqa: PLR0911 - one case per type
    """Build the record of type ``name`` from its Avro datum."""
    match name:
        case "StateBatch":
            return StateBatch(
                _header(datum),
                **{g: _unpack_group(g, c, datum) for g, c in STATE_GROUPS.items()},
            )
        case "CompletionBatch":
            return CompletionBatch(
                _header(datum),
                **{g: _unpack_group(g, c, datum) for g, c in COMPLETION_GROUPS.items()},
            )
        case "Heartbeat":
            ranks = tuple(RankHealth(**r) for r in datum["ranks"])
            nics = tuple(NicPort(**p) for p in datum["nics"])
            return Heartbeat(**(datum | {"ranks": ranks, "nics": nics}))
        case "Topology":
            return _topology(datum)
        case "Anomaly":
            return _anomaly(datum)
        case "RootCause":
            return _rootcause(datum)
        case "CommSummary":
            return _summary(datum)
    raise DecodeError("invalid", f"unknown record type {name!r}")


def _heartbeat_datum(hb: Heartbeat) -> Datum:
    nested = ("ranks", "nics")
    datum = {k: getattr(hb, k) for k in hb.__dataclass_fields__ if k not in nested}
    datum["ranks"] = [vars(r) for r in hb.ranks]
    datum["nics"] = [vars(p) for p in hb.nics]
    return datum


def _topology_datum(t: Topology) -> Datum:
    def comm(c: CommMembership) -> Datum:
        return {
            "comm": signed64(c.comm),
            "name": c.name,
            "nranks": c.nranks,
            "comm_rank": c.comm_rank,
            "ranks": list(c.ranks),
            "channels": [
                vars(ch) | {"tree_children": list(ch.tree_children)}
                for ch in c.channels
            ],
            "connections": [vars(x) for x in c.connections],
        }

    return {
        "job_id": t.job_id,
        "host": t.host,
        "ip": t.ip,
        "ts_ns": t.ts_ns,
        "ranks": [
            {
                "rank": r.rank,
                "local_rank": r.local_rank,
                "gpu": r.gpu,
                "nic": r.nic,
                "comms": [comm(c) for c in r.comms],
            }
            for r in t.ranks
        ],
    }


def _topology(d: Datum) -> Topology:
    def comm(c: Datum) -> CommMembership:
        return CommMembership(
            comm=unsigned64(c["comm"]),
            name=c["name"],
            nranks=c["nranks"],
            comm_rank=c["comm_rank"],
            ranks=tuple(c["ranks"]),
            channels=tuple(
                ChannelTopology(**(ch | {"tree_children": tuple(ch["tree_children"])}))
                for ch in c["channels"]
            ),
            connections=tuple(Connection(**x) for x in c["connections"]),
        )

    ranks = tuple(
        RankTopology(
            rank=r["rank"],
            local_rank=r["local_rank"],
            gpu=r["gpu"],
            nic=r["nic"],
            comms=tuple(comm(c) for c in r["comms"]),
        )
        for r in d["ranks"]
    )
    return Topology(d["job_id"], d["host"], d["ip"], d["ts_ns"], ranks)


def _anomaly_datum(a: Anomaly) -> Datum:
    return {
        "anomaly_id": a.anomaly_id,
        "job_id": a.job_id,
        "kind": a.kind.value,
        "comms": [signed64(c) for c in a.comms],
        "ranks": list(a.ranks),
        "onset_ns": a.onset_ns,
        "detected_ns": a.detected_ns,
        "emitted_wall_ns": a.emitted_wall_ns,
        "detector": a.detector,
        "summary": a.summary,
        "score": a.score,
    }


def _anomaly(d: Datum) -> Anomaly:
    return Anomaly(
        anomaly_id=d["anomaly_id"],
        job_id=d["job_id"],
        kind=FaultKind(d["kind"]),
        comms=tuple(unsigned64(c) for c in d["comms"]),
        ranks=tuple(d["ranks"]),
        onset_ns=d["onset_ns"],
        detected_ns=d["detected_ns"],
        detector=d["detector"],
        summary=d["summary"],
        score=d["score"],
        emitted_wall_ns=d["emitted_wall_ns"],
    )


def _culprit_datum(c: Culprit) -> Datum:
    return vars(c) | {
        "component": c.component.value,
        "kind": c.kind.value,
        "ranks": list(c.ranks),
        "rules": list(c.rules),
    }


def _evidence_datum(e: Evidence) -> Datum:
    return vars(e) | {"comm": None if e.comm is None else signed64(e.comm)}


def _culprit(c: Datum) -> Culprit:
    # A comm summary's culprits (its own schema) have no scope fields or rules.
    return Culprit(
        **(
            c
            | {
                "component": Component(c["component"]),
                "kind": FaultKind(c["kind"]),
                "ranks": tuple(c.get("ranks", ())),
                "rules": tuple(c.get("rules", ())),
            }
        )
    )


def _evidence(e: Datum) -> Evidence:
    return Evidence(
        **(e | {"comm": None if e["comm"] is None else unsigned64(e["comm"])})
    )


def _rootcause_datum(rc: RootCause) -> Datum:
    return {
        "incident_id": rc.incident_id,
        "revision": rc.revision,
        "job_id": rc.job_id,
        "kind": rc.kind.value,
        "culprits": [_culprit_datum(c) for c in rc.culprits],
        "evidence": [_evidence_datum(e) for e in rc.evidence],
        "anomaly_ids": list(rc.anomaly_ids),
        "onset_ns": rc.onset_ns,
        "detected_ns": rc.detected_ns,
        "resolved_ns": rc.resolved_ns,
        "detection_latency_ms": (rc.detected_ns - rc.onset_ns) / 1e6,
        "rca_latency_ms": (rc.resolved_ns - rc.detected_ns) / 1e6,
        "emitted_wall_ns": rc.emitted_wall_ns,
        "state": rc.state.value,
        "closed_ns": rc.closed_ns,
        "close_reason": rc.close_reason,
    }


def _rootcause(d: Datum) -> RootCause:
    culprits = tuple(_culprit(c) for c in d["culprits"])
    evidence = tuple(_evidence(e) for e in d["evidence"])
    return RootCause(
        incident_id=d["incident_id"],
        revision=d["revision"],
        job_id=d["job_id"],
        kind=FaultKind(d["kind"]),
        culprits=culprits,
        evidence=evidence,
        anomaly_ids=tuple(d["anomaly_ids"]),
        onset_ns=d["onset_ns"],
        detected_ns=d["detected_ns"],
        resolved_ns=d["resolved_ns"],
        emitted_wall_ns=d["emitted_wall_ns"],
        state=IncidentState(d["state"]),
        closed_ns=d["closed_ns"],
        close_reason=d["close_reason"],
    )


def _summary_datum(s: CommSummary) -> Datum:
    return {
        "job_id": s.job_id,
        "group": s.group,
        "groups": s.groups,
        "tick_ns": s.tick_ns,
        "data_ns": s.data_ns,
        "comms_total": s.comms_total,
        "rows": s.rows,
        "comms": [
            {
                "comm": signed64(c.comm),
                "kind": c.kind.value,
                "frontier_seq": c.frontier_seq,
                "last_progress_ns": c.last_progress_ns,
                "stall_ns": c.stall_ns,
                "blocked": [vars(b) | {"state": b.state.value} for b in c.blocked],
                "culprits": [_culprit_datum(x) for x in c.culprits],
                "evidence": [_evidence_datum(e) for e in c.evidence],
            }
            for c in s.comms
        ],
        "anomalies": [_anomaly_datum(a) for a in s.anomalies],
        "active": list(s.active),
        "emitted_wall_ns": s.emitted_wall_ns,
    }


def _summary(d: Datum) -> CommSummary:
    comms = tuple(
        CommStatus(
            comm=unsigned64(c["comm"]),
            kind=FaultKind(c["kind"]),
            frontier_seq=c["frontier_seq"],
            last_progress_ns=c["last_progress_ns"],
            stall_ns=c["stall_ns"],
            blocked=tuple(
                BlockedRank(**(b | {"state": BlockState(b["state"])}))
                for b in c["blocked"]
            ),
            culprits=tuple(_culprit(x) for x in c["culprits"]),
            evidence=tuple(_evidence(e) for e in c["evidence"]),
        )
        for c in d["comms"]
    )
    return CommSummary(
        job_id=d["job_id"],
        group=d["group"],
        groups=d["groups"],
        tick_ns=d["tick_ns"],
        data_ns=d["data_ns"],
        comms_total=d["comms_total"],
        rows=d["rows"],
        comms=comms,
        anomalies=tuple(_anomaly(a) for a in d["anomalies"]),
        active=tuple(d["active"]),
        emitted_wall_ns=d["emitted_wall_ns"],
    )
