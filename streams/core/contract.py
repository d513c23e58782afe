"""The input contract: what a decoded raw record must satisfy to reach state.

Decoding proves a record fits its Avro schema; it does not prove the values
make sense. :class:`~mycroft.streams.core.record_gate.RecordGate` checks each
record against this contract before the engine folds it in, drops the rows
that break it and reports them with one :class:`Reason` each. The contract
is written out in ``streams/core/README.md`` ("Input contract").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mycroft.schemas.records import Record

_S = 1_000_000_000


class Reason(StrEnum):
    """Why a record or row was rejected (``mycroft.dlq.reason``, metric label)."""

    NULL_VALUE = "null-value"  # a tombstone where no tombstone has a meaning
    TOO_LARGE = "too-large"  # more rows or a longer name than the contract allows
    TIME_RANGE = "time-out-of-range"  # a record time outside the plausible years
    TIME_JUMP = "time-jump"  # far from the host's own newest record time
    CLOCK_SKEW = "clock-skew"  # far ahead of the job's other hosts
    ROW_TIME = "row-time"  # a row time outside its record's time bounds
    RANK_RANGE = "rank-out-of-range"  # rank or peer < 0 or >= the job's world size
    RANK_NOT_ON_HOST = "rank-not-on-host"  # a rank the topology puts elsewhere
    UNKNOWN_RANK = "unknown-rank"  # (rank, comm) absent from the topology, held
    BAD_SEQ = "bad-seq"  # op sequence numbers that cannot be (done > issued, < -1)
    BAD_CODE = "bad-code"  # a code outside its vocabulary (op kind, direction)
    COUNTER_ORDER = "counter-order"  # not total >= gpu_ready >= transmitted >= done
    COUNTER_REGRESS = "counter-regress"  # a cumulative flow counter went down
    LAYOUT = "layout"  # op_nflows does not add up to the flow rows
    EMPTY_STATE = "empty-state"  # a state batch without rows from a host with ranks
    BAD_TOPOLOGY = "bad-topology"  # a topology record that contradicts itself
    HOLD_OVERFLOW = "hold-overflow"  # held rows beyond the hold bound


@dataclass(frozen=True)
class Contract:
    """Bounds of the input contract; each attribute's line says why.

    Attributes:
        min_time_ns: Oldest plausible record time (2000-01-01): a clock
            never set reads 1970, and such times overflow the detectors'
            arithmetic against current ones.
        max_time_ns: Newest plausible record time (2100-01-01): int64 max
            and other garbage ticks would make every finding unencodable.
        max_jump_ns: Furthest a host's record time may run ahead of its own
            newest accepted time (1 h): a live agent ticks every 100 ms; a
            host silent longer than this restarts with a new agent epoch.
        max_behind_ns: Furthest it may fall behind it (6 h): a spool replay
            after a broker outage is older by the outage, and the spool
            holds hours at most.
        max_skew_ns: Furthest a host may run ahead of the median newest
            time of the job's hosts (30 s): NTP keeps hosts within
            milliseconds and a job's records share one partition, so they
            are read within seconds of each other; further ahead, a broken
            clock would drag the job's event time along.
        row_slack_ns: Furthest a row time may lie after its batch's tick
            (5 s): both come from the same host's clock, the row earlier.
        max_rows: Most rows of one row group in one batch (65,536): 16 ranks
            x 64 comms x 64 flows; a real host reports under 20,000, and a
            larger batch is rejected whole before it costs any state work.
        max_name_len: Longest job id or host name (256 characters).
        max_ranks_per_host: Most ranks one topology record declares (256).
        hold_ns: How long rows of a (rank, comm) absent from the topology
            wait for it, in event time (5 s): agents send the topology
            before the first batch; 5 s covers a topology delayed by retries.
        max_held: Most records held at once per job (4,096): ~1.5 s of a
            1,024-rank job's batches; beyond it the oldest are rejected.
        flag_after: Invalid records from one host within ``flag_window_ns``
            that flag it (20): a single corrupt record is noise, a stream
            of them is a broken agent or clock.
        flag_window_ns: The window of ``flag_after`` (60 s of event time).
    """

    min_time_ns: int = 946_684_800 * _S
    max_time_ns: int = 4_102_444_800 * _S
    max_jump_ns: int = 3600 * _S
    max_behind_ns: int = 6 * 3600 * _S
    max_skew_ns: int = 30 * _S
    row_slack_ns: int = 5 * _S
    max_rows: int = 65_536
    max_name_len: int = 256
    max_ranks_per_host: int = 256
    hold_ns: int = 5 * _S
    max_held: int = 4096
    flag_after: int = 20
    flag_window_ns: int = 60 * _S

    def __post_init__(self) -> None:
        """Reject bounds that could not hold any valid record."""
        if not 0 < self.min_time_ns < self.max_time_ns:
            raise ValueError("need 0 < min_time_ns < max_time_ns")
        for name in ("max_jump_ns", "max_behind_ns", "max_skew_ns", "hold_ns"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if min(self.max_rows, self.max_name_len, self.max_ranks_per_host) < 1:
            raise ValueError("size limits must be >= 1")
        if self.max_held < 0 or self.flag_after < 1 or self.flag_window_ns <= 0:
            raise ValueError("need max_held >= 0, flag_after >= 1, flag_window_ns > 0")


@dataclass(frozen=True)
class Rejection:
    """Rows of one record that broke the contract, and why.

    Attributes:
        reason: The first rule the rows broke.
        record_type: ``StateBatch``, ``CompletionBatch``, ``Heartbeat`` or
            ``Topology``.
        host: The reporting host (may itself be what is wrong: too long).
        rows: Rows rejected (1 for a whole small record).
        detail: What was wrong, for a person.
        part: The rejected rows as a record of the same type (same header),
            what goes to the dead-letter topic; ``None`` when not kept.
        time_ns: The record's own time.
    """

    reason: Reason
    record_type: str
    host: str
    rows: int
    detail: str
    part: Record | None = None
    time_ns: int = 0
