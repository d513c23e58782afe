"""``mycroft incidents list|show|follow`` read root causes back from a real broker."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from mycroft.cli import main as cli_main
from mycroft.incident_console import Console
from mycroft.incident_text import iso
from mycroft.incidents import Source, follow
from mycroft.kafka_client import RecordPublisher, create_topics
from mycroft.schemas.records import (
    Anomaly,
    Culprit,
    Evidence,
    RankTopology,
    Record,
    RootCause,
    Topology,
)
from mycroft.schemas.vocab import Component, FaultKind, IncidentState
from mycroft.topics import TopicSet

pytestmark = pytest.mark.integration

NOW = time.time_ns()
S = 1_000_000_000
ONSET = NOW - 60 * S
WHY = "quiet for 5.1 s of event time (incident_quiet_s 5)"


def _rank(rank: int) -> Culprit:
    return Culprit(
        rank, "node-1", Component.GPU, FaultKind.HANG, 0.62,
        reason="its kernel never finished",
    )  # fmt: skip


def _rc(job: str, revision: int, culprit: Culprit, wall_ns: int = NOW) -> RootCause:
    return RootCause(
        f"{job}:hang:1a:{ONSET}", revision, job, FaultKind.HANG, (culprit,),
        (Evidence("rank 0 waits for rank 5 in allreduce op 17", rank=0),
         Evidence("rank 5 made no progress since onset", rank=5)),
        (f"{job}-a1",), ONSET, ONSET + 2 * S, ONSET + 2 * S + revision * S // 2,
        emitted_wall_ns=wall_ns,
    )  # fmt: skip


def _records() -> list[Record]:
    nic = Culprit(
        5, "node-1", Component.NIC, FaultKind.HANG, 0.91, peer=9, channel=2,
        reason="sends staged, none completed", scope="nic", device="mlx5_1",
        ranks=(4, 5),
    )  # fmt: skip
    topo = Topology(
        "job-a", "node-1", "10.0.0.1", ONSET,
        tuple(RankTopology(r, r - 4, f"gpu{r - 4}", "mlx5_1") for r in (4, 5)),
    )  # fmt: skip
    anomaly = Anomaly(
        "job-a-a1", "job-a", FaultKind.HANG, (26,), (0, 5), ONSET, ONSET + 2 * S,
        "hang", "allreduce op 17 stopped on 8 ranks",
    )  # fmt: skip
    old = _rc("job-b", 0, _rank(3), wall_ns=NOW - 3 * 86_400 * S)
    ended = replace(
        _rc("job-b", 1, _rank(3), wall_ns=NOW - 3 * 86_400 * S + 9 * S),
        state=IncidentState.CLOSED, closed_ns=ONSET + 9 * S, close_reason=WHY,
    )  # fmt: skip
    return [topo, anomaly, _rc("job-a", 0, _rank(5)), _rc("job-a", 1, nic), old, ended]


def _publish(bootstrap: str, topics: TopicSet, records: list[Record]) -> None:
    pub = RecordPublisher(bootstrap, topics)
    for record in records:
        pub.publish(record)
    assert pub.flush(30) == 0


@pytest.fixture(scope="module")
def published(kafka_bootstrap: str) -> Iterator[tuple[str, str]]:
    prefix = f"incidents.{time.time_ns()}."
    topics = TopicSet(prefix, partitions=2)
    create_topics(kafka_bootstrap, topics)
    _publish(kafka_bootstrap, topics, _records())
    yield kafka_bootstrap, prefix


def _cli(
    capsys: pytest.CaptureFixture[str], where: tuple[str, str], *args: str
) -> tuple[int, str, str]:
    bootstrap, prefix = where
    action, *rest = args
    code = cli_main(
        ["incidents", action, "--bootstrap", bootstrap, "--topic-prefix", prefix, *rest]
    )
    got = capsys.readouterr()
    return code, got.out, got.err


def test_list_shows_open_and_recent_incidents(
    published: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, published, "list")
    assert code == 0
    assert "open" in out and "NIC mlx5_1 of node-1 (ranks 4, 5): nic (0.91)" in out
    assert "job-b" not in out  # closed three days ago: neither open nor recent
    code, out, _ = _cli(capsys, published, "list", "--since", "1e6")
    (line,) = [ln for ln in out.splitlines() if "job-b" in ln]
    assert "closed" in line and "rank 3 on node-1: gpu (0.62), rev 1" in line
    assert line.endswith(f"  closed {iso(ONSET + 9 * S)}: {WHY}")


def test_list_json_of_one_job(
    published: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, published, "list", "--json", "--job", "job-a")
    assert code == 0
    (row,) = json.loads(out)["incidents"]
    assert row["job_id"] == "job-a" and row["status"] == "open"
    assert (row["revision"], row["revisions"]) == (1, 2)
    assert row["subject"] == "NIC mlx5_1 of node-1 (ranks 4, 5)"
    assert row["detection_latency_s"] == pytest.approx(2.0)


def test_show_prints_the_whole_card(
    published: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, published, "show", "job-a:hang")
    assert code == 0, out
    for line in (
        "  culprit      NIC mlx5_1 of node-1 (ranks 4, 5)",
        "  where        NIC mlx5_1 of host node-1, link 5 -> 9, channel 2",
        "  component    nic",
        "  fault        hang",
        "  confidence   0.91",
        "  why          sends staged, none completed",
        "    - rank 0 waits for rank 5 in allreduce op 17",
        "    - rank 5 made no progress since onset",
        "2.00 s after onset",
        "0.50 s after detection",
        "hang: allreduce op 17 stopped on 8 ranks",
        "  revisions (2):",
        "    rev 0 ",
        "rank 5 on node-1: gpu (0.62)",
    ):
        assert line in out, line


def test_show_json_has_every_revision_and_the_anomalies(
    published: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, published, "show", "job-a", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [r["revision"] for r in doc["history"]] == [0, 1]
    assert doc["latest"]["culprits"][0]["scope"] == "nic"
    assert doc["latest"]["culprits"][0]["ranks"] == [4, 5]
    assert doc["latest"]["rca_latency_s"] == pytest.approx(0.5)
    assert [a["anomaly_id"] for a in doc["anomalies"]] == ["job-a-a1"]


def test_show_names_the_gpu_of_a_rank_culprit(
    published: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap, prefix = published
    rc = replace(_rc("job-a", 0, _rank(5)), incident_id="job-a:gpu-only")
    _publish(bootstrap, TopicSet(prefix, partitions=2), [rc])
    code, out, _ = _cli(capsys, published, "show", "job-a:gpu-only")
    assert code == 0
    assert "  where        host node-1, GPU gpu1, NIC mlx5_1" in out


def test_show_of_an_unknown_id_says_how_to_find_one(
    published: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, published, "show", "no-such-incident")
    assert code == 4
    assert out == ""
    assert "no incident on incidents." in err
    assert "mycroft incidents list" in err
    assert "Traceback" not in err


def _wait_for(pred: Callable[[], bool], timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_follow_prints_new_incidents_and_revisions(
    published: tuple[str, str],
) -> None:
    bootstrap, prefix = published
    topics = TopicSet(prefix, partitions=2)
    out, err = io.StringIO(), io.StringIO()
    stop = threading.Event()
    console = Console(out, err=err, job_id="job-c")
    worker = threading.Thread(
        target=follow, args=(Source(bootstrap, topics), console, stop)
    )
    worker.start()
    try:
        _wait_for(lambda: "following incidents" in err.getvalue())
        assert out.getvalue() == ""  # what was there before is read, not printed
        first = replace(_rc("job-c", 0, _rank(5)), incident_id="job-c:live")
        nic = replace(first.culprits[0], component=Component.NIC, confidence=0.8)
        second = replace(first, revision=1, culprits=(nic,))
        ended = replace(
            second, revision=2, state=IncidentState.CLOSED,
            closed_ns=ONSET + 9 * S, close_reason=WHY,
        )  # fmt: skip
        other = _rc("job-a", 5, _rank(1))
        _publish(bootstrap, topics, [first, first, second, other, ended])
        _wait_for(lambda: "CLOSED rev 2" in out.getvalue())
    finally:
        stop.set()
        worker.join(30)
    text = out.getvalue()
    head = "ROOT CAUSE rev 0: hang at rank 5 on host node-1: the GPU, likely (0.62)"
    assert head in text
    assert "next step: drain node-1 and run the GPU diagnostics" in text
    assert "incident job-c:live of job job-c" in text
    assert "evidence: rank 0 waits for rank 5 in allreduce op 17" in text
    head = "ROOT CAUSE rev 1: hang at rank 5 on host node-1: the NIC, likely (0.80)"
    assert head in text
    assert "[revised: component was gpu]" in text
    assert text.count("ROOT CAUSE") == 2  # the duplicate and job-a are not shown
    closed = f"CLOSED rev 2: incident job-c:live of job job-c: {WHY}"
    assert text.splitlines()[-1].endswith(closed)


def test_follow_json_runs_until_interrupted(published: tuple[str, str]) -> None:
    bootstrap, prefix = published
    with subprocess.Popen(
        [sys.executable, "-m", "mycroft", "incidents", "follow", "--json",
         "--bootstrap", bootstrap, "--topic-prefix", prefix],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stderr is not None and proc.stdout is not None
            assert "following incidents" in proc.stderr.readline()
            rc = replace(_rc("job-d", 0, _rank(2)), incident_id="job-d:json")
            _publish(bootstrap, TopicSet(prefix, partitions=2), [rc])
            doc = json.loads(proc.stdout.readline())
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(10) == 130  # Ctrl-C, as every command
            assert time.monotonic() - started < 2.0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert doc["event"] == "new"
    assert doc["root_cause"]["incident_id"] == "job-d:json"
    assert doc["root_cause"]["culprits"][0]["subject"] == "rank 2 on node-1"


def test_follow_shows_the_demo_incident_live(kafka_bootstrap: str) -> None:
    from mycroft.demo import _parser, run  # noqa: PLC0415 (starts a worker)

    argv = ["incidents", "follow", "--bootstrap", kafka_bootstrap,
            "--job", "demo-job", "--no-anomalies"]  # fmt: skip
    with subprocess.Popen(
        [sys.executable, "-m", "mycroft", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stderr is not None and proc.stdout is not None
            assert "following incidents" in proc.stderr.readline()
            demo = io.StringIO()
            args = _parser().parse_args(
                ["--bootstrap", kafka_bootstrap, "--duration", "16",
                 "--fault", "gpu-hang:at=6"]
            )  # fmt: skip
            assert run(args, demo) == 0, demo.getvalue()
            headline = proc.stdout.readline()
            step = proc.stdout.readline()
            where = proc.stdout.readline()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(10) == 130  # Ctrl-C
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "ROOT CAUSE rev 0: hang at rank" in headline and "(GPU " in headline
    assert "next step: drain node" in step
    assert "of job demo-job" in where
    incident = where.split()[1]
    assert incident in demo.getvalue()  # the demo printed the same incident


def test_follow_from_the_beginning_prints_the_history(
    published: tuple[str, str],
) -> None:
    bootstrap, prefix = published
    out, err = io.StringIO(), io.StringIO()
    stop = threading.Event()
    console = Console(out, err=err, job_id="job-a")
    source = Source(bootstrap, TopicSet(prefix, partitions=2))
    worker = threading.Thread(
        target=follow, args=(source, console, stop), kwargs={"from_beginning": True}
    )
    worker.start()
    try:
        _wait_for(lambda: "following incidents" in err.getvalue())
    finally:
        stop.set()
        worker.join(30)
    text = out.getvalue()
    assert "anomaly hang: allreduce op 17 stopped on 8 ranks" in text
    assert "ROOT CAUSE rev 0: hang at rank 5" in text
    assert "ROOT CAUSE rev 1: hang at NIC mlx5_1 of host node-1 (ranks 4, 5)" in text


def _timed(*argv: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mycroft", "incidents", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return time.monotonic() - started, done


def test_list_and_show_answer_within_2_s(published: tuple[str, str]) -> None:
    """Partitions assigned directly and read to their end: no group to join
    (the interpreter's start, about 0.3 s, included)."""
    bootstrap, prefix = published
    where = ["--bootstrap", bootstrap, "--topic-prefix", prefix]
    took, done = _timed("list", *where)
    assert done.returncode == 0 and "job-a" in done.stdout, done.stderr
    assert took <= 2.0, took
    took, done = _timed("show", f"job-a:hang:1a:{ONSET}", *where)
    assert done.returncode == 0, done.stderr
    head, step, *_ = done.stdout.splitlines()  # the latest revision's answer
    assert head.startswith("hang at ") and step.startswith("  next step    ")
    assert took <= 2.0, took


def test_a_closed_pipe_ends_list_quietly(published: tuple[str, str]) -> None:
    bootstrap, prefix = published
    reader, writer = os.pipe()
    os.close(reader)  # `mycroft incidents list | head -0`: nobody reads
    done = subprocess.run(
        [sys.executable, "-m", "mycroft", "incidents", "list", "--since", "1e9",
         "--bootstrap", bootstrap, "--topic-prefix", prefix],
        stdout=writer, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
    )  # fmt: skip
    os.close(writer)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
