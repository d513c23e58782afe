"""The node agent against a real Kafka broker: outage, kill -9, full spool.

Every test writes ops into a real ring file with a writer thread, runs
``mycroft agent`` as a subprocess, and reads everything back from Kafka.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mycroft.infra.kafka_broker import KafkaBroker
from mycroft.kafka_client import DecodingConsumer, create_topics
from mycroft.producers import ring_layout as L
from mycroft.producers.ring import RingWriter
from mycroft.schemas.records import CompletionBatch, Heartbeat, Record, StateBatch
from mycroft.topics import TopicSet
from tests.agent_process import stop_agent

pytestmark = pytest.mark.integration
COMM = 0xA11CE


class OpWriter(threading.Thread):
    """One training process: completes one op every ``period_s`` until stopped."""

    def __init__(self, path: Path, period_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.ring = RingWriter(path, rank=0, nslots=1 << 16)
        self.period_s, self.ops = period_s, 0
        self.stop = threading.Event()

    def run(self) -> None:
        w = self.ring
        w.write(L.Comm(time.time_ns(), COMM, 2, 0, 1, 0))
        while not self.stop.is_set():
            t, s = time.time_ns(), self.ops
            w.write(L.OpIssued(t, COMM, s, 1024, 0, 1, 1, 1))
            w.flow_progress(t + 1, COMM, s, 0, 0, 1, 4, 4, 2, 1)
            w.write(L.FlowDone(t + 2, COMM, s, t + 1, 0, 0, 1, 4))
            w.write(L.OpDone(t + 3, COMM, s, t + 1, 1))
            self.ops += 1
            time.sleep(self.period_s)

    def finish(self) -> int:
        self.stop.set()
        self.join()
        self.ring.close()
        return self.ops


def start_agent(
    tmp: Path, bootstrap: str, prefix: str, *extra: str
) -> subprocess.Popen[bytes]:
    log = open(tmp / "agent.log", "ab")  # noqa: SIM115 - closed by the caller
    args = [
        sys.executable,
        "-m",
        "mycroft",
        "agent",
        "--job-id",
        "job1",
        "--host",
        "h1",
        "--ring-dir",
        str(tmp / "rings"),
        "--spool-dir",
        str(tmp / "spool"),
        "--bootstrap",
        bootstrap,
        "--topic-prefix",
        prefix,
        "--partitions",
        "1",
        "--delivery-timeout-ms",
        "3000",
        "--retry-s",
        "0.5",
        "--spool-fsync-s",
        "0",
        *extra,
    ]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc


def consume_all(
    bootstrap: str, prefix: str, group: str, idle_s: float = 4.0
) -> list[Record]:
    topics = TopicSet(prefix, 1)
    consumer = DecodingConsumer(
        bootstrap,
        group,
        [topics.state, topics.completion, topics.heartbeat],
        topics.deadletter,
    )
    out: list[Record] = []
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s:
            got = consumer.poll(0.5)
            if got:
                last = time.monotonic()
            out += [r for _, r in got]
    finally:
        consumer.close()
    assert consumer.stats.dead_lettered == 0
    return out


def completed_ops(records: list[Record]) -> tuple[Counter[int], Counter[int], int]:
    """(op seq counts raw, after dedup by the batch key, duplicates removed)."""
    raw: Counter[int] = Counter()
    dedup: Counter[int] = Counter()
    seen: set[tuple[str, str, int, int]] = set()
    dups = 0
    for r in records:
        if not isinstance(r, CompletionBatch):
            continue
        h = r.header
        seqs = r.op["seq"].tolist()
        raw.update(seqs)
        key = (h.job_id, h.host, h.agent_epoch, h.agent_seq)
        if key in seen:
            dups += 1
            continue
        seen.add(key)
        dedup.update(seqs)
    return raw, dedup, dups


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "rings").mkdir()
    yield tmp_path


def _setup(bootstrap: str, make: Callable[..., str]) -> str:
    prefix = make("agent") + "."
    create_topics(bootstrap, TopicSet(prefix, 1))
    return prefix


def test_broker_outage_loses_nothing_and_dedup_key_removes_duplicates(
    kafka_broker: KafkaBroker, workdir: Path, unique_name: Callable[..., str]
) -> None:
    bootstrap = kafka_broker.bootstrap
    prefix = _setup(bootstrap, unique_name)
    writer = OpWriter(workdir / "rings" / "rank0.ring")
    writer.start()
    agent = start_agent(workdir, bootstrap, prefix)
    time.sleep(3)
    kafka_broker.stop()
    time.sleep(5)  # longer than the 3 s delivery timeout: deliveries fail, spool fills
    kafka_broker.start()
    time.sleep(4)
    total = writer.finish()
    time.sleep(1)
    assert stop_agent(agent, workdir / "agent.log") == 0
    records = consume_all(bootstrap, prefix, unique_name("g"))
    raw, dedup, _dups = completed_ops(records)
    assert set(dedup) == set(range(total)), "every op completion arrived"
    assert max(dedup.values()) == 1, "after dedup by (job, host, epoch, seq) none twice"
    assert sum(raw.values()) >= sum(dedup.values())
    beats = [r for r in records if isinstance(r, Heartbeat)]
    assert max(b.delivery_failures for b in beats) > 0
    assert max(b.batches_spooled for b in beats) > 0
    assert beats[-1].spool_dropped == 0
    states = [r for r in records if isinstance(r, StateBatch)]
    assert states and all(len(s.rc) == 1 for s in states)


def test_replayed_duplicates_carry_the_same_dedup_key(
    kafka_bootstrap: str, workdir: Path, unique_name: Callable[..., str]
) -> None:
    """Records delivered but not yet acknowledged when the agent dies are sent again
    with identical bytes, so the dedup key removes exactly them."""
    prefix = _setup(kafka_bootstrap, unique_name)
    writer = OpWriter(workdir / "rings" / "rank0.ring")
    writer.start()
    agent = start_agent(workdir, kafka_bootstrap, prefix)
    time.sleep(3)
    stop_agent(agent, workdir / "agent.log", signal.SIGKILL)  # kill -9
    time.sleep(1.5)
    # Make the restart replay *everything* still in the spool: forget the ack cursor.
    (workdir / "spool" / "cursor.json").unlink(missing_ok=True)
    agent = start_agent(workdir, kafka_bootstrap, prefix)
    time.sleep(3)
    total = writer.finish()
    time.sleep(1)
    assert stop_agent(agent, workdir / "agent.log") == 0
    records = consume_all(kafka_bootstrap, prefix, unique_name("g"))
    raw, dedup, dups = completed_ops(records)
    assert dups > 0, "the replay produced duplicates"
    assert set(dedup) == set(range(total)), "no loss across kill -9"
    assert max(dedup.values()) == 1, "every duplicate is removed by the dedup key"
    assert max(raw.values()) >= 2


def test_full_spool_is_reported(
    kafka_bootstrap: str, workdir: Path, unique_name: Callable[..., str]
) -> None:
    prefix = _setup(kafka_bootstrap, unique_name)
    writer = OpWriter(workdir / "rings" / "rank0.ring", period_s=0.002)
    writer.start()
    # Phase 1: Kafka unreachable (nothing listens on port 9), a tiny spool overflows.
    agent = start_agent(
        workdir,
        "127.0.0.1:9",
        prefix,
        "--spool-max-bytes",
        "65536",
        "--spool-segment-bytes",
        "16384",
        "--duration-s",
        "4",
        "--shutdown-flush-s",
        "1",
    )
    assert agent.wait(timeout=30) == 0
    writer.finish()
    # Phase 2: the real broker; what is left of the spool is replayed, and its
    # heartbeats say how many batches the full spool dropped.
    agent = start_agent(workdir, kafka_bootstrap, prefix, "--duration-s", "3")
    assert agent.wait(timeout=30) == 0
    beats = [
        r
        for r in consume_all(kafka_bootstrap, prefix, unique_name("g"), 3.0)
        if isinstance(r, Heartbeat)
    ]
    assert max(b.spool_dropped for b in beats) > 0
    assert "spool full" in (workdir / "agent.log").read_text()
    assert os.path.exists(workdir / "spool")
