"""The Faust stream worker: raw topics -> per-job engine -> anomalies, root causes.

One agent consumes the four raw topics plus an internal *tick* topic, all
co-partitioned by job (``partition_for``). Records are decoded and folded into
the job's :class:`~mycroft.streams.core.engine.Analyzer`; ticks (sent by a
timer to every partition this worker owns) run ``evaluate`` for the jobs of
that partition, send what is new, and every ``snapshot_interval_s`` write the
engine snapshots to a changelog-backed table and commit that partition's
offsets. Running evaluation and snapshots *inside* the stream keeps every table
write on the right changelog partition, and committing only right after a
snapshot means a restarted worker resumes exactly where its restored engines
left off. The ``emitted`` table makes re-sent findings idempotent.

Run: ``mycroft streams worker --bootstrap HOST:PORT [--app-id ID] [--prefix P]``.

The same machinery runs the stages of the two-stage worker for jobs too large
for one worker (``--stage split|comm|job``, see ``streams/SCALING.md``): the
``comm`` stage keys its engines by ``job/comm_group`` (the Kafka key of the
split topic) and sends comm summaries; the ``job`` stage resolves them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import faust
from faust.types import TP

from mycroft import dead_letters
from mycroft.broker_watch import BrokerWatch
from mycroft.cli_errors import ExitCode
from mycroft.errors import ConfigError, DecodeError
from mycroft.kafka_client import deadletter_headers
from mycroft.kafka_logging import ClientRateLimit
from mycroft.schemas.codec import Codec
from mycroft.schemas.records import (
    Anomaly,
    CommSummary,
    CompletionBatch,
    Heartbeat,
    Record,
    RootCause,
    StateBatch,
)
from mycroft.streams.consumer_guards import install_guards
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.event_time import Source
from mycroft.streams.core.host_clocks import HostClocks
from mycroft.streams.faust_auth import faust_auth
from mycroft.streams.faust_runtime import (
    MAX_MESSAGE_BYTES,
    Engine,
    EngineFactory,
    Finding,
    JobRouter,
    add_counts,
    comm_ops,
    dump_changed,
    is_fresh,
    mark_sent,
    next_first,
    rank_chunks,
    record_job,
    turns,
)
from mycroft.streams.faust_settings import StreamSettings, parse_settings
from mycroft.streams.faust_split import build_split_app
from mycroft.streams.faust_tables import awaited_table
from mycroft.streams.faust_topics import ensure_topics, tick_topic
from mycroft.streams.invalid_records import (
    WorkerMetrics,
    as_decode_error,
    dead_letter_value,
    gate_of,
    host_label,
)
from mycroft.streams.read_positions import Position, ReadPositions
from mycroft.topics import (
    TopicSet,
    group_partition,
    parse_group_key,
    partition_for,
)

log = logging.getLogger(__name__)
_NEVER = 10**9  # Faust must not commit on its own: we commit after snapshots
SNAPSHOT_BUDGET = 0.05
"""Most of a worker's time that snapshots of one partition may take: after a
snapshot that took ``c`` s, the next one is due ``max(snapshot_interval_s,
c / SNAPSHOT_BUDGET)`` later. Offsets are committed only with snapshots, so
a restart replays at most that much. The snapshot's cost per job size is in
``bench/results/snapshot_cost.json`` (``bench/snapshot_cost.py``): at cost
``c`` a job is snapshotted every ``c / SNAPSHOT_BUDGET`` seconds."""
RATE_STEP_S = 1.0
"""Window step of the rate tables, and how often their sums are written.

The tables are keyed by job, one ``name -> count`` map per window (ranks in
``rank-chunks``, comms in hex in ``comm-ops``): every table write is one
changelog message per window it falls in (five for the hopping table), sent
by Faust from the event loop at ~0.4 ms each on a loaded core. Keyed by rank
and comm and written every 0.2 s tick, two 64-rank jobs made ~3,600 messages/s
and kept each worker's loop in producer flushes, 5 s behind its partitions;
a 1,024-rank job would have made ~30,000."""


EVALS_PER_STEP = 10
"""Most evaluations of one job per turn of a tick (the tick's time budget is
checked after each): a job with a backlog yields to the others' turns."""
EVAL_BUDGET_S = 0.25
"""Longest a tick evaluates one partition's jobs (less what the partition's
last snapshot took, when one is due in the same tick) before it yields to the
event loop: a worker catching up on a backlog goes on at the next tick from
where it stopped (the job's clock holds its place, and the jobs not served
go first), so no single job blocks the others for long, and the outcome is
the same."""
MIN_EVAL_S = 0.05
"""What a tick evaluates at least, however long its snapshot takes."""
PRODUCE_SKEW_S = 1.0
"""How much later than a job's newest record another record of a partition
must have been produced before that partition is taken as read past the job
(producer clocks of different hosts, and their batching, differ by less)."""


def source_types(stage: str, topics: TopicSet) -> dict[str, str]:
    """Record type -> the source topic it comes from, for ``stage``."""
    if stage == "comm":
        split = topics.split_state
        return {"Topology": split, "StateBatch": split, "CompletionBatch": split}
    if stage == "job":
        return {"Topology": topics.topology, "CommSummary": topics.comm_summary}
    return {
        "Topology": topics.topology,
        "StateBatch": topics.state,
        "CompletionBatch": topics.completion,
        "Heartbeat": topics.heartbeat,
    }


def job_source(
    where: dict[str, Position],
    read_s: dict[str, float],
    produced_s: float | None,
    type_topics: dict[str, str],
) -> Callable[[str], Source]:
    """A job's view of its sources for its event clock.

    ``where``: each source topic's partition read to its end, or not;
    ``read_s``: the newest broker (create) time processed there;
    ``produced_s``: when the job's newest record read so far was produced
    (None: not known, as after a restore). A topic with a backlog whose
    processed records were produced after the job's newest one by
    ``PRODUCE_SKEW_S`` holds nothing of the job older than it (``moving``):
    producers append in the order they produce. Else the reader is
    ``behind``. A record type this stage does not read is at its end.
    """

    def source(name: str) -> Source:
        topic = type_topics.get(name)
        if topic is None or where.get(topic, -1) == "end":
            return "end"
        if (
            produced_s is not None
            and read_s.get(topic, 0.0) >= produced_s + PRODUCE_SKEW_S
        ):
            return "moving"
        return "behind"

    return source


def default_engine_factory(
    stage: str = "single", comm_groups: int = 8, config: DetectorConfig | None = None
) -> EngineFactory:
    """The real engine of a stage (imported lazily: scipy/networkx are heavy).

    ``single``: the per-job ``Analyzer``; ``comm``: a ``CommAnalyzer`` per
    ``job/comm_group`` key; ``job``: the per-job ``JobResolver``; each with
    the thresholds ``config`` (default: ``DetectorConfig()``).
    """
    if stage == "comm":
        from mycroft.streams.core.comm_analyzer import CommAnalyzer  # noqa: PLC0415

        def comm_engine(key: str) -> Engine:
            job, group = parse_group_key(key)
            return CommAnalyzer(job, group, comm_groups, config)

        return comm_engine
    if stage == "job":
        from mycroft.streams.core.job_resolver import JobResolver  # noqa: PLC0415

        return lambda job: JobResolver(job, config)
    from mycroft.streams.core.engine import Analyzer  # noqa: PLC0415

    return lambda job: Analyzer(job, config)


def faust_config(settings: StreamSettings) -> dict[str, Any]:
    """Keyword arguments of ``faust.App`` for ``settings``."""
    return {
        "broker": [f"kafka://{s}" for s in settings.bootstrap.split(",")],
        "store": "memory://",
        "topic_partitions": settings.partitions,
        "topic_replication_factor": 1,
        "web_enabled": settings.web_enabled,
        "web_port": settings.web_port or 6066,
        "web_bind": settings.web_address,
        "datadir": str(settings.data_path),
        "broker_commit_every": _NEVER,
        "broker_commit_interval": float(_NEVER),
        "broker_session_timeout": settings.session_timeout_s,
        "broker_heartbeat_interval": 1.0,
        "broker_rebalance_timeout": 20.0,
        "table_standby_replicas": 0,
        "table_cleanup_interval": 1.0,
        "stream_wait_empty": False,
        "consumer_auto_offset_reset": "earliest",
        "producer_max_request_size": MAX_MESSAGE_BYTES,
        "stream_buffer_maxsize": 4096,
    } | faust_auth(settings.security)


class Pipeline:
    """Decode -> engine -> send, with the tables that make it restartable."""

    def __init__(
        self,
        app: faust.App,
        settings: StreamSettings,
        factory: EngineFactory,
        topics: TopicSet,
        sources: Sequence[str] | None = None,
        *,
        config: DetectorConfig | None = None,
    ) -> None:
        """``config``: the one ``factory``'s engines are built with, which
        restored engines take on (``core/snapshot_parts.py``); None: they
        keep theirs."""
        self.app, self.settings, self.topics = app, settings, topics
        self.codec = Codec()
        self.metrics = WorkerMetrics()
        self.clocks: dict[str, HostClocks] = {}  # per job: intake time checks
        self.router = JobRouter(factory, config)
        self.counts: Counter[str] = Counter()
        self.next_snapshot: dict[int, float] = {}  # monotonic due time
        self.first_turn: dict[int, str | None] = {}  # job a tick serves first
        self.snapshot_s: dict[int, float] = {}  # what the last snapshot took
        self.last_stats = time.monotonic()
        self.max_lag_s = 0.0
        self.max_event_s = 0.0  # longest source event handled since the stats
        self.positions = ReadPositions(lambda: app.consumer)  # offsets processed
        self.read_s: dict[tuple[str, int], float] = {}  # newest broker time read
        self.type_topics = source_types(settings.stage, topics)
        # Completion batches per source partition and job, summed into the
        # windowed tables once per RATE_STEP_S; the step they arrived in.
        self.pending_rates: dict[int, dict[str, list[CompletionBatch]]] = {}
        self.rate_step: dict[int, int] = {}
        n = settings.partitions
        raw: dict[str, Any] = {"value_serializer": "raw", "key_serializer": "raw"}
        self.tick = app.topic(tick_topic(settings), partitions=n, **raw)
        raw_sources = [
            topics.state,
            topics.completion,
            topics.heartbeat,
            topics.topology,
        ]
        self.source_names = [*(sources or raw_sources), self.tick.get_topic_name()]
        self.source = app.topic(*self.source_names, **raw)
        self.anomaly = app.topic(topics.anomaly, **raw)
        self.rootcause = app.topic(topics.rootcause, **raw)
        self.summary = app.topic(topics.comm_summary, **raw)
        self.deadletter = app.topic(topics.deadletter, **raw)
        big = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        self.snapshots = awaited_table(
            app,
            "engine-snapshots",
            partitions=n,
            key_type=str,
            value_type=bytes,
            extra_topic_configs=big,
        )
        self.emitted = awaited_table(app, "emitted", partitions=n, key_type=str)
        self.chunks = app.Table(
            "rank-chunks", default=dict, partitions=n, key_type=str
        ).tumbling(RATE_STEP_S, expires=60.0)
        self.ops = app.Table(
            "comm-ops", default=dict, partitions=n, key_type=str
        ).hopping(5 * RATE_STEP_S, RATE_STEP_S, expires=60.0)

    async def handle(self, event: Any) -> None:
        """Process one event of the source channel (a record or a tick)."""
        t0 = time.monotonic()
        msg = event.message
        self._ensure_loaded(msg.partition)
        if msg.topic == self.source_names[-1]:
            await self.on_tick(msg.partition)
        else:
            await self.on_record(msg)
        took = time.monotonic() - t0
        self.max_event_s = max(self.max_event_s, took)
        self.metrics.event_s.observe(took)

    def _ensure_loaded(self, partition: int) -> None:
        if partition in self.router.loaded:  # the hot path: already restored
            return
        n = self.settings.partitions
        blobs = [
            (j, b)
            for j, b in self.snapshots.items()
            if self.partition_of(j, n) == partition
        ]
        if self.router.restore(blobs, partition, time.monotonic()):
            log.info("restored %d job engine(s) of partition %d", len(blobs), partition)

    async def on_record(self, msg: Any) -> None:
        """Decode one raw record and fold it into its job's engine."""
        # Processed, whatever becomes of it: a dead-lettered last record of a
        # partition must not leave it looking unread (it would hold the
        # event clocks of its jobs).
        self.positions.processed(TP(msg.topic, msg.partition), msg.offset)
        key = (msg.topic, msg.partition)
        self.read_s[key] = max(self.read_s.get(key, 0.0), float(msg.timestamp or 0.0))
        if msg.value is None and self.on_tombstone(msg):
            return
        try:
            record = self.codec.decode(msg.value)
        except DecodeError as exc:
            await self.dead_letter(
                msg, exc.located(msg.topic, msg.partition, msg.offset)
            )
            return
        job = self.route(msg, record)
        late = self.intake_problem(job, record)
        if late is not None:
            await self.dead_letter(
                msg, late.located(msg.topic, msg.partition, msg.offset)
            )
            return
        slot = self.router.slot(job, msg.partition)
        if slot.holds(msg.topic, msg.partition, msg.offset):
            # A snapshot written after the last commit already holds it (the
            # worker stopped between writing its snapshots and committing).
            self.counts["taken_before"] += 1
            return
        slot.ingest(record, time.monotonic(), float(msg.timestamp or 0.0))
        slot.took(msg.topic, msg.partition, msg.offset)
        self.counts["decoded"] += 1
        self.counts["rows"] += len(record.rc) if isinstance(record, StateBatch) else 0
        self.max_lag_s = max(self.max_lag_s, time.time() - msg.timestamp)
        if self.settings.rates and isinstance(record, CompletionBatch):
            self.update_rates(job, record, msg.partition)

    def on_tombstone(self, msg: Any) -> bool:
        """A null value: on the topology topic (key ``job/host``) that host
        left the job; True when handled (elsewhere it is dead-lettered)."""
        self.metrics.tombstones.labels(msg.topic).inc()
        key = bytes(msg.key or b"").decode("utf-8", "replace")
        if msg.topic != self.type_topics.get("Topology") or "/" not in key:
            return False
        job, host = key.rsplit("/", 1)
        slot = self.router.slots.get(job)
        gate = gate_of(slot.engine) if slot is not None else None
        if slot is not None:
            slot.topology.pop(host, None)
        if gate is not None:
            gate.host_left(host)
        self.counts["hosts_left"] += 1
        log.info("host %s left job %s (tombstone on %s)", host, job, msg.topic)
        return True

    def intake_problem(self, job: str, record: Record) -> DecodeError | None:
        """A raw record whose time is implausible for its host, before that
        time can move the job's event clock (``core/host_clocks.py``)."""
        if not isinstance(record, StateBatch | CompletionBatch | Heartbeat):
            return None
        head = record if isinstance(record, Heartbeat) else record.header
        t = record.ts_ns if isinstance(record, Heartbeat) else record.header.tick_ns
        clocks = self.clocks.setdefault(job, HostClocks())
        problem = clocks.problem(head.job_id, head.host, t)
        if problem is None:
            clocks.accept(head.host, t)
            return None
        reason, detail = problem
        known = head.host if head.host in clocks.newest else "undeclared"
        self.metrics.invalid.labels(reason.value, known).inc()
        name = type(record).__name__
        return DecodeError(reason.value, f"{name} of {job}/{head.host}: {detail}")

    async def report_invalid(self, job: str, engine: Engine) -> None:
        """Dead-letter and count what the job's record gate rejected."""
        gate = gate_of(engine)
        if gate is None:
            return
        for r in gate.take():
            self.metrics.invalid.labels(r.reason.value, host_label(r, gate)).inc()
            err = as_decode_error(r, job)
            self.counts[f"invalid.{err.reason}"] += 1
            await self.send_dead_letter(
                job.encode(),
                dead_letter_value(r, self.codec),
                deadletter_headers(err, f"{job}/{r.host}"),
            )
        for host in gate.newly_flagged:
            self.metrics.flagged.labels(job, host).set(1)
            log.warning(
                "host %s of job %s keeps sending invalid records (%s); its "
                "invalid rows are dead-lettered on %s: check its agent and clock",
                host,
                job,
                ", ".join(f"{k}={n}" for (k, h), n in gate.counts.items() if h == host),
                self.topics.deadletter,
            )
        gate.newly_flagged = []

    def partition_of(self, key: str, partitions: int) -> int:
        """Source partition of an engine key (``job/comm_group`` in stage 1)."""
        if self.settings.stage == "comm":
            job, group = parse_group_key(key)
            return group_partition(job, group, partitions)
        return partition_for(key, partitions)

    def route(self, msg: Any, record: Record) -> str:
        """Engine key of a record: its job, or ``job/comm_group`` in stage 1."""
        if self.settings.stage == "comm":
            return bytes(msg.key or b"").decode("utf-8", "replace")
        return record_job(record)

    def update_rates(self, job: str, batch: CompletionBatch, partition: int) -> None:
        """Windowed exports per job: chunks per rank (tumbling), completed ops
        per comm (hopping, 5 steps).

        Batches are kept per source partition and job, and summed and
        written to the tables once per wall-clock step (:meth:`flush_rates`):
        one changelog message per job and window, whatever the job's size
        and the batch and tick rates, and one numpy pass per step, not one
        per batch (a 1,024-rank job sends hundreds of batches a second).
        """
        self.pending_rates.setdefault(partition, {}).setdefault(job, []).append(batch)

    def flush_rates(self, partition: int, wall_s: float) -> None:
        """Write ``partition``'s rate sums of the last finished step to the tables.

        Called by that partition's ticks (a table write goes to the changelog
        partition of the current record). The first tick of a new step writes
        what arrived since the previous write into the previous step's window:
        a window holds the records that arrived from its start to the first
        tick after its end, written at most one tick after that end.
        """
        step = int(wall_s // RATE_STEP_S)
        last = self.rate_step.setdefault(partition, step)
        if step == last:
            return
        self.rate_step[partition] = step
        at = (last + 0.5) * RATE_STEP_S
        chunks_at, ops_at = self.chunks.clone(at), self.ops.clone(at)
        for job, batches in self.pending_rates.pop(partition, {}).items():
            chunks = {str(r): n for r, n in rank_chunks(batches).items()}
            ops = {f"{c:x}": n for c, n in comm_ops(batches).items()}
            if chunks:
                chunks_at[job].apply(add_counts, chunks)
            if ops:
                ops_at[job].apply(add_counts, ops)

    async def read_positions(self, partition: int) -> dict[str, Position]:
        """Where this worker is in each source topic's ``partition``
        (``read_positions.py``: read to its end, or the last offset processed)."""
        topics = sorted(set(self.type_topics.values()))
        at = await self.positions.positions(TP(t, partition) for t in topics)
        return {tp.topic: pos for tp, pos in at.items()}

    async def dead_letter(self, msg: Any, err: DecodeError) -> None:
        """Send undecodable bytes to the dead-letter topic with the reason."""
        self.counts["dead_lettered"] += 1
        self.counts[f"dead_lettered.{err.reason}"] += 1
        log.warning("%s; sent to %s", err, self.topics.deadletter)
        source = f"{err.topic}[{err.partition}]@{err.offset}"
        await self.send_dead_letter(msg.key, msg.value, deadletter_headers(err, source))

    async def send_dead_letter(
        self, key: bytes | None, value: bytes | None, headers: dead_letters.Headers
    ) -> None:
        """Send one dead letter, cut to fit (``mycroft/dead_letters.py``); a
        send that fails anyway is logged and counted, never raised: the bad
        record must not take the agent down."""
        data, fitted = dead_letters.fit(value, key, headers)
        try:
            await self.deadletter.send(key=key, value=data, headers=fitted)
        except Exception:  # the dead-letter topic refused it; keep consuming
            self.counts["dead_letter_failed"] += 1
            log.exception("dead letter (%d bytes) not sent", len(value or b""))

    async def on_tick(self, partition: int) -> None:
        """Evaluate the jobs of ``partition``; snapshot + commit when due."""
        wall = time.monotonic()
        self.flush_rates(partition, time.time())
        where = await self.read_positions(partition)
        due = wall >= self.next_snapshot.get(partition, 0.0)
        # The snapshot is part of this event: leave it the time it last took.
        spare = self.snapshot_s.get(partition, 0.0) if due else 0.0
        deadline = wall + max(EVAL_BUDGET_S - spare, MIN_EVAL_S)
        read_s = {
            t: self.read_s.get((t, partition), 0.0)
            for t in set(self.type_topics.values())
        }
        slots = self.router.on_partition(partition)
        first = self.first_turn.get(partition)
        served: set[str] = set()

        def out_of_time() -> bool:
            return time.monotonic() >= deadline

        for slot in turns(slots, out_of_time, first):
            served.add(slot.job_id)
            source = job_source(where, read_s, slot.produced_s, self.type_topics)
            findings = slot.advance(source, wall, EVALS_PER_STEP, out_of_time)
            if findings:
                slot.dirty = True
                await self.emit(slot.job_id, findings)
        self.first_turn[partition] = next_first(slots, served, first)
        for slot in slots:
            await self.report_invalid(slot.job_id, slot.engine)
            self.counts["held_jobs"] += slot.clock.held
        if due:
            started = time.monotonic()
            await self.snapshot(partition)
            cost = self.snapshot_s[partition] = time.monotonic() - started
            # A big job's engine takes a while to encode: space its snapshots
            # so that they cost at most SNAPSHOT_BUDGET of the worker's time.
            # The snapshot's own time, not the tick's: a tick that waited on
            # the broker (offsets, a finding's delivery) spaced them seconds
            # apart on a loaded machine, and a restart replayed that much.
            self.next_snapshot[partition] = wall + max(
                self.settings.snapshot_interval_s, cost / SNAPSHOT_BUDGET
            )
        if wall - self.last_stats >= self.settings.stats_interval_s:
            self.log_stats(wall)

    def log_stats(self, wall: float) -> None:
        """Log counters, rank-state rows/s and the worst consumer lag seen."""
        rate = self.counts["rows"] / max(wall - self.last_stats, 1e-9)
        if self.positions.asked:
            self.counts["offset_requests"] = self.positions.asked
        slots = list(self.router.slots.values())
        hold = max(
            ((s.trace_ns - s.clock.released_ns) / 1e9 for s in slots if s.trace_ns),
            default=0.0,
        )
        log.info(
            "stats rows_per_s=%.0f max_lag_s=%.3f event_hold_s=%.3f max_event_s=%.3f "
            "late=%d jobs=%d %s",
            rate,
            self.max_lag_s,
            hold,
            self.max_event_s,
            sum(s.clock.late for s in slots),
            len(self.router.slots),
            " ".join(f"{k}={v}" for k, v in sorted(self.counts.items())),
        )
        self.metrics.observe(
            self.max_lag_s, hold, len(self.router.slots), self.counts["rows"]
        )
        self.counts["rows"] = 0
        self.last_stats, self.max_lag_s, self.max_event_s = wall, 0.0, 0.0

    async def emit(self, job: str, findings: Sequence[Finding | CommSummary]) -> None:
        """Send findings not sent before; record them in the ``emitted`` table.

        Comm summaries (stage 1) are periodic state, not findings: always sent.
        """
        state = self.emitted.get(job)
        sent = 0
        for f in findings:
            if isinstance(f, CommSummary):
                await self.send_summary(f)
                continue
            if not is_fresh(state, f):
                self.counts["suppressed"] += 1
                continue
            await self.send_finding(job, f)
            state = mark_sent(state, f)
            sent += 1
        if sent:
            self.emitted[job] = state
            await self.app.producer.flush()
            await self.emitted.written()

    async def send_finding(self, job: str, finding: Finding) -> None:
        """Encode and send one finding keyed and partitioned by job."""
        stamped = replace(finding, emitted_wall_ns=time.time_ns())
        topic = self.rootcause if isinstance(finding, RootCause) else self.anomaly
        key = "rca.rootcause" if isinstance(finding, RootCause) else "detect.anomaly"
        p = partition_for(job, self.topics.partitions(key))
        await topic.send(
            key=job.encode(), value=self.codec.encode(stamped), partition=p
        )
        self.counts[
            "root_causes" if isinstance(finding, RootCause) else "anomalies"
        ] += 1
        if isinstance(finding, Anomaly):
            log.info("anomaly %s: %s", finding.anomaly_id, finding.summary)
        else:
            log.info(
                "root cause %s rev %d (%s)",
                finding.incident_id, finding.revision, finding.state.value,
            )  # fmt: skip

    async def send_summary(self, summary: CommSummary) -> None:
        """Encode and send one comm summary keyed and partitioned by its job."""
        stamped = replace(summary, emitted_wall_ns=time.time_ns())
        job = summary.job_id
        p = partition_for(job, self.topics.partitions("detect.commsummary"))
        await self.summary.send(
            key=job.encode(), value=self.codec.encode(stamped), partition=p
        )
        self.counts["summaries"] += 1

    async def snapshot(self, partition: int) -> None:
        """Write this partition's changed engine snapshots, then commit its offsets.

        A job that neither ingested nor reported since its last snapshot is
        not written again; one silent for ``job_idle_s`` is evicted and its
        snapshot deleted, so finished jobs stop costing evaluation time.
        """
        for job_id in self.router.evict_idle(
            partition, time.monotonic(), self.settings.job_idle_s
        ):
            self.snapshots.pop(job_id, None)
            self.counts["evicted"] += 1
            log.info("evicted idle job %s", job_id)
        blobs, too_big = dump_changed(self.router.on_partition(partition))
        for job_id, blob in blobs.items():
            self.snapshots[job_id] = blob
            self.counts["snapshots"] += 1
        for job_id, size in too_big.items():
            self.counts["snapshots_too_big"] += 1
            log.error(
                "snapshot of job %s is %.1f MB, over the %.0f MB record limit: "
                "not written, and partition %d's offsets stay uncommitted so "
                "that a restart replays from its last snapshot; see "
                "streams/SCALING.md (snapshot size) for what grows",
                job_id,
                size / 1e6,
                MAX_MESSAGE_BYTES / 2**20,
                partition,
            )
        if too_big:
            return
        # Offsets become durable only after the snapshots holding their
        # records are (faust_tables: Faust's flush may return before).
        await self.snapshots.written()
        tps = {TP(name, partition) for name in self.source_names}
        await self.app.consumer.commit(tps)  # flushes the producer first

    async def send_ticks(self) -> None:
        """Timer body: one tick to every tick-topic partition this worker owns."""
        name = self.source_names[-1]
        for tp in self.app.consumer.assignment():
            if tp.topic == name:
                await self.tick.send(value=b"", partition=tp.partition)

    def on_revoked(self, revoked: set[TP]) -> None:
        """Drop engines of revoked partitions (the next owner restores them)."""
        parts = {tp.partition for tp in revoked}
        self.router.drop(parts)
        for p in parts:
            self.pending_rates.pop(p, None)
            self.rate_step.pop(p, None)
        self.positions.drop(parts)
        self.read_s = {k: v for k, v in self.read_s.items() if k[1] not in parts}


def build_app(
    settings: StreamSettings, factory: EngineFactory | None = None
) -> tuple[faust.App, Pipeline]:
    """Create the Faust app, its topics, tables, agent and timer.

    ``settings.stage`` picks the sources and the engine: ``single`` reads the
    raw topics, ``comm`` the split topic, ``job`` the topology and summary
    topics (``split`` has its own app: :func:`build_split_app`).
    """
    app = faust.App(settings.group_id, **faust_config(settings))
    topics = TopicSet(settings.prefix, settings.partitions)
    sources = {
        "comm": [topics.split_state],
        "job": [topics.topology, topics.comm_summary],
    }.get(settings.stage)
    config = settings.detector_config()
    engines = factory or default_engine_factory(
        settings.stage, settings.comm_groups, config
    )
    pipe = Pipeline(
        app, settings, engines, topics, sources, config=None if factory else config
    )

    # Faust creates its consumer on first use; the guards must be on it
    # before its first rebalance seeks.
    install_guards(app.consumer, pipe.source_names[:-1], pipe.counts)

    @app.agent(pipe.source, name="mycroft-ingest")
    async def ingest(stream: Any) -> None:
        async for event in stream.events():
            try:
                await pipe.handle(event)
            except Exception:  # one bad record must not restart the agent
                pipe.counts["handle_failed"] += 1
                msg = event.message
                log.exception(
                    "record %s[%d]@%d failed; skipped",
                    msg.topic, msg.partition, msg.offset,
                )  # fmt: skip

    @app.timer(interval=settings.evaluate_interval_s, name="mycroft-tick")  # type: ignore[untyped-decorator]  # faust's timer decorator is untyped
    async def tick() -> None:
        await pipe.send_ticks()

    async def revoked(sender: Any, /, *args: Any, signal: Any, **kw: Any) -> None:
        pipe.on_revoked(set(args[0] if args else kw.get("revoked", ())))

    app.on_partitions_revoked.connect(revoked)

    return app, pipe


INTERRUPT_GRACE_S = 1.5
"""After Ctrl-C, how long the worker may take to stop cleanly before it exits
anyway (Faust's shutdown waits on Kafka, for ever while the broker is away).
Exiting then is a crash the design allows: the next start resumes from the
changelog and the committed offsets, and reaches the same verdicts."""


class Worker(faust.Worker):
    """Faust's worker, remembering whether Ctrl-C (SIGINT) stopped it, and
    exiting :data:`INTERRUPT_GRACE_S` after it if the clean stop hangs.

    Named ``Worker`` as Faust's: mode labels the log lines by class name, and
    :data:`mycroft.streams.worker_process.READY_MARK` is ``[^Worker]: Ready``.
    SIGTERM keeps Faust's clean stop, however long it takes.
    """

    interrupted = False

    def _on_sigint(self) -> None:
        if not self.interrupted:
            timer = threading.Timer(INTERRUPT_GRACE_S, _exit_interrupted)
            timer.daemon = True
            timer.start()
        self.interrupted = True
        super()._on_sigint()

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        """Faust's handlers, with aiokafka's repeated lines rate-limited."""
        super().on_setup_root_logger(logger, level)
        limit = ClientRateLimit()
        for handler in logger.handlers:
            handler.addFilter(limit)


def _exit_interrupted() -> None:
    log.warning(
        "stopping took more than %g s after Ctrl-C (is Kafka away?): exiting "
        "now; the next start resumes from the changelog", INTERRUPT_GRACE_S,
    )  # fmt: skip
    logging.shutdown()
    os._exit(int(ExitCode.INTERRUPTED))


def run_worker(settings: StreamSettings, factory: EngineFactory | None = None) -> int:
    """Create topics, then run a Faust worker until it is stopped; return its
    code: 0 after SIGTERM, 130 after Ctrl-C (SIGINT), as every command."""
    ensure_topics(settings)
    settings.data_path.mkdir(parents=True, exist_ok=True)
    if settings.stage == "split":
        app = build_split_app(settings, faust_config(settings))
    else:
        app, pipe = build_app(settings, factory)
        pipe.metrics.serve(settings.metrics_port, settings.metrics_address)
    worker = Worker(app, loglevel=settings.loglevel, quiet=True)
    watch = BrokerWatch(
        settings.bootstrap,
        "the worker retries until it answers (it reads on where it stopped); "
        "Faust's client lines about it show once a kind every 30 s",
    )
    watch.start()
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code:
            return int(exc.code)
    finally:
        watch.close()
    return int(ExitCode.INTERRUPTED) if worker.interrupted else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``mycroft streams worker --bootstrap HOST:PORT ...``; return the exit code."""
    try:
        command, settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"mycroft streams: {exc}", file=sys.stderr)
        return 2
    log.info("effective settings: %s", settings)
    if command == "worker":
        return run_worker(settings)
    return 2  # pragma: no cover  # argparse restricts the choices
