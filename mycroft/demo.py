"""``mycroft demo``: the whole pipeline live on this machine.

1. starts a local Kafka broker (or uses ``--bootstrap``) and creates the topics;
2. starts a Faust stream worker (``mycroft streams worker``);
3. runs a simulated training job live into Kafka with one injected fault;
4. prints anomalies and root causes as they arrive on their topics, through
   the console of ``mycroft incidents follow``, each at its ISO-8601 time and
   the seconds since the demo launched the job (``(+12.345 s)``).

The injected fault's label is read only here, after the fact, to print what
was injected next to what Mycroft found; the pipeline never sees it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from mycroft.cli_parser import mycroft_parser
from mycroft.incident_console import Console
from mycroft.kafka_client import DecodingConsumer, create_topics
from mycroft.schemas.records import RootCause
from mycroft.schemas.text import when
from mycroft.streams.faust_settings import StreamSettings
from mycroft.streams.worker_process import WorkerProcess
from mycroft.topics import TopicSet
from mycroft.verdict import headline

MAX_ANOMALY_LINES = 6


def _parser() -> argparse.ArgumentParser:
    p = mycroft_parser(
        "demo",
        "Run the whole pipeline live on this machine: a local Kafka broker (or "
        "--bootstrap), a stream worker, and a simulated training job with one "
        "injected fault; print the anomalies and root causes as they arrive, "
        "then what was injected next to what Mycroft found.",
    )
    p.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    p.add_argument(
        "--fault",
        default="gpu-hang:at=12",
        help="fault to inject, NAME[:key=value,...] (mycroft simulate --help)",
    )
    p.add_argument("--ranks", type=int, default=64, help="world size = tp*pp*dp")
    p.add_argument("--tp", type=int, default=8, help="tensor parallel size")
    p.add_argument("--pp", type=int, default=2, help="pipeline stages")
    p.add_argument("--dp", type=int, default=4, help="data parallel replicas")
    p.add_argument("--duration", type=float, default=30.0, help="simulated seconds")
    p.add_argument("--seed", type=int, default=7, help="simulator seed")
    p.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir)")
    return p


def _spawn(args: list[str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mycroft", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )


def _stop(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _watch(
    consumer: DecodingConsumer, sim: subprocess.Popen[str], start_ns: int, out: IO[str]
) -> list[RootCause]:
    """Print anomalies and root causes live until the simulation ended (+5 s)."""
    console = Console(
        out,
        max_anomalies=MAX_ANOMALY_LINES,
        stamp=lambda ns: when(ns, start_ns),
    )
    console.start()
    grace_end: float | None = None
    while grace_end is None or time.monotonic() < grace_end:
        for _, record in consumer.poll(timeout_s=0.5):
            console.show(record)
        if grace_end is None and sim.poll() is not None:
            grace_end = time.monotonic() + 5.0
    if console.hidden_anomalies:
        print(
            f"  ({console.hidden_anomalies} more anomalies not shown: "
            "one per affected communicator)",
            file=out,
        )
    return [inc.latest for inc in console.book.incidents.values()]


def _summary(truth_path: Path, found: list[RootCause], start_ns: int) -> str:
    truth: dict[str, Any] = json.loads(truth_path.read_text())
    lines = ["", "injected (ground truth, shown only for comparison):"]
    for f in truth["faults"]:
        onset = when(round(f["onset_s"] * 1e9), start_ns)
        lines.append(
            f"  {f['fault']}: rank {f['rank']}, component {f['component']}, "
            f"kind {f['kind']}, at {onset}"
        )
    if not found:
        lines.append("Mycroft found no root cause.")
        return "\n".join(lines)
    lines.append("Mycroft's root causes (latest revision of each incident):")
    for rc in found:
        if not rc.culprits:
            continue
        lines.append(
            f"  {headline(rc)}"
            f" (detected {rc.detection_latency_s:.2f} s after onset, "
            f"root cause {rc.rca_latency_s:.2f} s later)"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    """Run the demo; return 0 when Mycroft produced at least one root cause."""
    with ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory())
        )
        workdir.mkdir(parents=True, exist_ok=True)
        bootstrap = args.bootstrap
        if not bootstrap:
            from mycroft.infra.kafka_broker import KafkaBroker  # noqa: PLC0415

            broker = KafkaBroker(workdir / "broker")
            stack.callback(broker.close)
            print("starting Kafka ...", file=out, flush=True)
            bootstrap = broker.start()
        topics = TopicSet()
        create_topics(bootstrap, topics)
        print(f"Kafka at {bootstrap}; topics ready", file=out, flush=True)

        worker_log = workdir / "worker.log"
        worker = WorkerProcess(
            StreamSettings(
                bootstrap,
                app_id=f"mycroft-demo-{uuid.uuid4().hex[:6]}",
                data_dir=str(workdir / "faust"),
            ),
            worker_log,
        )
        stack.callback(worker.stop)
        worker.start(90)
        print(f"stream worker ready (log: {worker_log})", file=out, flush=True)

        consumer = DecodingConsumer(
            bootstrap,
            f"demo-{uuid.uuid4().hex[:6]}",
            [topics.anomaly, topics.rootcause, topics.topology],
            topics.deadletter,
        )
        stack.callback(consumer.close)
        truth = workdir / "truth.json"
        sim = _spawn(
            [
                "simulate",
                "--ranks",
                str(args.ranks),
                "--tp",
                str(args.tp),
                "--pp",
                str(args.pp),
                "--dp",
                str(args.dp),
                "--seed",
                str(args.seed),
                "--duration",
                str(args.duration),
                "--fault",
                args.fault,
                "--kafka",
                bootstrap,
                "--truth",
                str(truth),
                "--job-id",
                "demo-job",
            ],
            workdir / "simulate.log",
        )
        stack.callback(_stop, sim)
        start_ns = time.time_ns()
        print(
            f"simulating {args.ranks} ranks (tp={args.tp} pp={args.pp} dp={args.dp}) "
            f"for {args.duration:.0f}s with fault {args.fault!r} ...",
            file=out,
            flush=True,
        )
        found = _watch(consumer, sim, start_ns, out)
        if sim.returncode != 0:
            print((workdir / "simulate.log").read_text()[-2000:], file=out)
            return 1
        print(_summary(truth, found, start_ns), file=out, flush=True)
        return 0 if found else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mycroft demo``."""
    return run(_parser().parse_args(argv))  # failures: mycroft.cli_errors
