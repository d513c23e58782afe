"""``mycroft simulate``: run the cluster simulator to a trace file or to Kafka.

Examples::

    mycroft simulate --ranks 64 --tp 8 --pp 2 --dp 4 --duration 30 \\
        --fault nic-bandwidth:rank=9,at=12,severity=0.8 \\
        --out run.trace.gz --truth run.truth.json
    mycroft simulate --ranks 64 --tp 8 --pp 2 --dp 4 --duration 120 \\
        --kafka localhost:9092 --truth live.truth.json
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import logging
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from mycroft.cli_parser import mycroft_parser
from mycroft.errors import ConfigError, MycroftError
from mycroft.producers.sim.config import (
    COUNTER_MODELS,
    Hardware,
    Noise,
    SimConfig,
    Workload,
    from_ranks,
)
from mycroft.producers.sim.engine import SimResult, simulate
from mycroft.producers.sim.faults import FAULTS, parse_spec
from mycroft.producers.sim.phases import CHECKPOINT_RANKS, Phases
from mycroft.producers.tracefile import RecordWriter, TraceFileWriter
from mycroft.schemas.records import Record

log = logging.getLogger(__name__)


class PacedWriter:
    """Hold each record until its trace time has come in wall-clock time.

    ``speed`` is trace seconds per wall second: 0.25 publishes a 24 s trace
    over 96 s. The workers need no setting for it: their verdicts follow the
    records' own clock (event time), whatever pace they arrive at.
    """

    def __init__(self, inner: RecordWriter, start_ns: int, speed: float = 1.0) -> None:
        self.inner = inner
        self.start_ns = start_ns
        self.speed = speed
        self.t0 = time.monotonic()

    def write(self, record: Record, ts_ns: int) -> None:
        """Sleep until ``ts_ns`` is due, then pass the record on."""
        due = (ts_ns - self.start_ns) / 1e9 / self.speed
        delay = due - (time.monotonic() - self.t0)
        if delay > 0:
            time.sleep(delay)
        self.inner.write(record, ts_ns)

    def close(self) -> None:
        """Close the inner writer."""
        self.inner.close()


INTERRUPT_FLUSH_S = 1.0
"""Longest wait for deliveries when the run is interrupted or failing: Ctrl-C
stops ``simulate --kafka`` within 2 s, also with the broker gone."""


class KafkaWriter:
    """Publish records live through :class:`mycroft.kafka_client.RecordPublisher`.

    Attributes:
        flush_s: how long :meth:`close` waits for outstanding deliveries.
    """

    def __init__(self, bootstrap: str, prefix: str = "") -> None:
        from mycroft.broker_watch import PRODUCING, BrokerWatch  # noqa: PLC0415
        from mycroft.kafka_client import RecordPublisher, create_topics  # noqa: PLC0415
        from mycroft.topics import TopicSet  # noqa: PLC0415

        topics = TopicSet(prefix)
        create_topics(bootstrap, topics)
        self.publisher = RecordPublisher(bootstrap, topics)
        self.flush_s = 30.0
        self._watch = BrokerWatch(bootstrap, PRODUCING)
        self._watch.start()

    def write(self, record: Record, ts_ns: int) -> None:
        """Queue one record and serve delivery callbacks."""
        self.publisher.publish(record)
        self.publisher.poll(0)

    def close(self) -> None:
        """Wait for outstanding deliveries."""
        self._watch.close()
        left = self.publisher.flush(self.flush_s)
        stats = self.publisher.stats
        if left or stats.failed:
            log.warning(
                "kafka: %d undelivered, %d failed (%s)",
                left,
                stats.failed,
                stats.last_error,
            )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``mycroft simulate``."""
    p = mycroft_parser(
        "simulate",
        "Simulate an LLM training job's collectives on a modelled cluster, with "
        "labelled faults: to a trace file (virtual time, fast) or live to "
        "Kafka, with the injected faults written to a ground-truth file.",
        epilog="faults: "
        + ", ".join(FAULTS)
        + ". SPEC is NAME[:key=value,...] with keys rank, peer, host, at (s), "
        "duration (s), severity (0..1) and, per fault, period/down (link-flap), "
        "stall/every (proxy-delay), count (switch-congestion, net-background-traffic).",
    )
    p.add_argument("--ranks", type=int, required=True, help="world size = tp*pp*dp")
    p.add_argument("--tp", type=int, default=8, help="tensor parallel size (in a host)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--dp", type=int, default=1, help="data parallel replicas")
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault (repeatable)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="random seed: same seed, same trace"
    )
    p.add_argument("--duration", type=float, default=30.0, help="virtual seconds")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", type=Path, help="trace file (.gz compresses)")
    out.add_argument("--kafka", metavar="BOOTSTRAP", help="publish live to Kafka")
    p.add_argument("--topic-prefix", default="", help="prefix of the Kafka topics")
    p.add_argument("--truth", type=Path, required=True, help="ground-truth JSON file")
    p.add_argument("--job-id", default="sim", help="job id of the records")
    p.add_argument(
        "--interval-ms", type=int, default=100, help="sampling period of the agents"
    )
    p.add_argument(
        "--counters",
        choices=COUNTER_MODELS,
        default="fluid",
        help="how send counters move: fluid (default), slots (credits), or "
        "nccl (the slots timing as NCCL's profiler plugin observes it: a send's "
        "G at most T + 1 and its ready-wait time; producers/sim/README.md)",
    )
    p.add_argument(
        "--moe-bytes",
        type=int,
        default=0,
        help="MoE: each TP group is an expert-parallel group and every layer "
        "adds a dispatch and a combine all-to-all of this many bytes of tokens "
        "per rank, split unevenly over the experts (0: off; producers/sim/README.md)",
    )
    _add_rhythm(p)
    p.add_argument(
        "--watchdog-abort",
        type=float,
        default=0.0,
        metavar="S",
        help="S seconds after a fault that blocks the job (nic-down, "
        "process-crash, gpu-hang), NCCL's watchdog and torchrun tear every rank "
        "down: its ring freezes, its heartbeat entry stops (0: off; real jobs "
        "use 600 s; producers/sim/README.md)",
    )
    p.add_argument(
        "--watchdog-spread",
        type=float,
        default=1.0,
        metavar="S",
        help="with --watchdog-abort: the hosts' teardowns fall uniformly within "
        "S seconds of each other (default 1)",
    )
    pace = p.add_mutually_exclusive_group()
    pace.add_argument(
        "--realtime",
        dest="realtime",
        action="store_true",
        default=None,
        help="pace records to wall-clock time (default with --kafka)",
    )
    pace.add_argument(
        "--fast",
        dest="realtime",
        action="store_false",
        help="as fast as possible (default with --out)",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="paced: trace s per wall s (below 1 for jobs too large for the "
        "workers at hand in real time; the workers follow the records' own clock)",
    )
    return p


def _add_rhythm(p: argparse.ArgumentParser) -> None:
    """The training loop's own rhythm (``phases.py``): healthy behaviour a
    detector must not page on."""
    g = p.add_argument_group("training rhythm (healthy; all off by default)")
    g.add_argument(
        "--checkpoint-every",
        type=float,
        default=0.0,
        metavar="S",
        help="a checkpoint every S seconds: the training stops while it saves",
    )
    g.add_argument(
        "--checkpoint-s", type=float, default=3.0, help="how long a checkpoint stops"
    )
    g.add_argument(
        "--checkpoint-ranks",
        choices=CHECKPOINT_RANKS,
        default="all",
        help="all: every rank stops (a sharded save); rank0: rank 0 saves alone "
        "while the others wait for it in the next collective (torch.save)",
    )
    g.add_argument(
        "--eval-every",
        type=float,
        default=0.0,
        metavar="S",
        help="an evaluation phase every S seconds: forward passes only, "
        "another op mix (no backward, no gradient reduction)",
    )
    g.add_argument(
        "--eval-iterations", type=int, default=4, help="iterations of one evaluation"
    )
    g.add_argument(
        "--resume-slowdown",
        type=float,
        default=1.0,
        metavar="X",
        help="compute of the first iteration after a checkpoint or evaluation "
        "takes X times longer (allocator and cache warm-up, data loader refill)",
    )
    g.add_argument(
        "--gc-pauses-per-min",
        type=float,
        default=0.0,
        help="Python GC pauses (0.05-0.2 s each) per minute, on random ranks: "
        "a rank's CPU stops issuing ops",
    )


def _phases(args: argparse.Namespace) -> Phases:
    return Phases(
        checkpoint_every_s=args.checkpoint_every,
        checkpoint_s=args.checkpoint_s,
        checkpoint_ranks=args.checkpoint_ranks,
        eval_every_s=args.eval_every,
        eval_iterations=args.eval_iterations,
        resume_slowdown=args.resume_slowdown,
    )


def config_from(args: argparse.Namespace) -> SimConfig:
    """Build and validate the simulation config from parsed arguments."""
    if not 0.01 <= args.speed <= 100:
        raise ConfigError(
            f"--speed must be 0.01..100 trace s per wall s, got {args.speed}"
        )
    tp, pp, dp = from_ranks(args.ranks, args.tp, args.pp, args.dp)
    cfg = SimConfig(
        tp=tp,
        pp=pp,
        dp=dp,
        duration_s=args.duration,
        interval_ms=args.interval_ms,
        seed=args.seed,
        job_id=args.job_id,
        hardware=Hardware(counters=args.counters),
        workload=Workload(moe_bytes=args.moe_bytes),
        noise=Noise(gc_pauses_per_min=args.gc_pauses_per_min),
        phases=_phases(args),
        watchdog_abort_s=args.watchdog_abort,
        watchdog_spread_s=args.watchdog_spread,
    )
    if args.kafka:
        now_ns = time.time_ns() // 1_000_000 * 1_000_000
        cfg = dataclasses.replace(cfg, start_ns=now_ns)
    cfg.validate()
    return cfg


def _claim(target: Path) -> Path:
    """A new folder beside ``target`` and the path of the same name in it.

    Writing there keeps the file's own name (a .gz trace is compressed, and
    gzip records the name) until it is moved over ``target``.

    Raises:
        OSError: naming ``target``: it is a folder, or its folder is missing
            or not writable.
    """
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    folder = target.with_name(f".{target.name}.partial-{secrets.token_hex(4)}")
    try:
        folder.mkdir()
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(target)) from exc
    return folder / target.name


def _discard(partial: Path) -> None:
    partial.unlink(missing_ok=True)
    partial.parent.rmdir()


@contextmanager
def staged(targets: Sequence[Path]) -> Iterator[dict[Path, Path]]:
    """Paths to write instead of ``targets``, moved over them at the end.

    Yields target -> the path to write. When the block raises (a fault its
    spec names wrongly for this job, an error midway, Ctrl-C), they are
    removed: no target is left behind, partial or empty, and one that existed
    keeps its content.
    """
    partial: dict[Path, Path] = {}
    try:
        for target in targets:
            partial[target] = _claim(target)
        yield partial
        for target, path in partial.items():
            path.replace(target)
    except BaseException:
        for path in partial.values():
            _discard(path)
        raise
    for path in partial.values():
        path.parent.rmdir()


def _paced(
    args: argparse.Namespace, cfg: SimConfig, writer: RecordWriter
) -> RecordWriter:
    realtime = bool(args.kafka) if args.realtime is None else args.realtime
    return PacedWriter(writer, cfg.start_ns, args.speed) if realtime else writer


def run(args: argparse.Namespace) -> SimResult:
    """Run one simulation as the arguments say; write the trace and truth files.

    Both appear only once the run succeeded (:func:`staged`).
    """
    cfg = config_from(args)
    specs = [parse_spec(s) for s in args.fault]
    targets = [args.truth] if args.kafka else [args.out, args.truth]
    with staged(targets) as files:
        kafka = KafkaWriter(args.kafka, args.topic_prefix) if args.kafka else None
        writer = _paced(args, cfg, kafka or TraceFileWriter(files[args.out]))
        try:
            result = simulate(cfg, specs, writer)
        except BaseException:
            if kafka is not None:  # Ctrl-C or an error: do not wait 30 s on Kafka
                kafka.flush_s = INTERRUPT_FLUSH_S
            raise
        finally:
            writer.close()
        files[args.truth].write_text(json.dumps(result.truth(), indent=2) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mycroft simulate``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        started = time.monotonic()
        result = run(args)
    except ConfigError as exc:
        print(f"mycroft simulate: error: {exc}", file=sys.stderr)
        return 2
    except MycroftError as exc:
        print(f"mycroft simulate: failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"simulated {result.config.ranks} ranks x {result.config.duration_s:g} s: "
        f"{result.iterations} iterations, {result.records} records, "
        f"{len(result.faults)} fault(s), {time.monotonic() - started:.1f} s wall"
    )
    return 0
