"""Ctrl-C on every long-running command: time to exit, exit code, no traceback.

Usage: python bench/ctrl_c.py [--out bench/results/ctrl_c.json]

A terminal's Ctrl-C sends SIGINT to the whole foreground process group; so
does this script, to each command started in a session of its own on a local
Kafka broker (and, for the commands that keep running without one, with the
broker unreachable). A command is interrupted once it says it is at work
(a line matching its ``ready`` pattern) or, failing that, after its settle
time, and must exit within ``GOAL_S`` with exit code 130 and no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mycroft.infra.kafka_broker import KafkaBroker, fetch_jars
from mycroft.kafka_client import create_topics
from mycroft.topics import TopicSet

GOAL_S = 2.0
"""Longest time from Ctrl-C to exit (issue: 'Ctrl-C stops any command within 2 s')."""
KILL_AFTER_S = 30.0
BROKER_GONE_S = 5.0
"""How long after its broker stopped a command is interrupted."""
STACK_LINES = ("  File", "Thread 0x", "Current thread")
"""faulthandler's lines, kept for a command that had to be killed."""
AT_WORK_S = 3.0
"""After its ready line, how long a command works before the Ctrl-C."""
NO_BROKER = "127.0.0.1:9"
SIM = "--ranks 16 --tp 8 --pp 2 --dp 1 --duration 600"
LONG_RUNNING = ("agent", "streams worker", "sinks", "incidents follow", "replay",
                "simulate --kafka")  # fmt: skip
PHASES = {
    "broker up": (*LONG_RUNNING, "agent (Kafka unreachable)", "demo"),
    "broker gone": LONG_RUNNING,
    "no broker": (*LONG_RUNNING[1:], "topics create"),
}
"""Which commands run in each phase: one at a time on a live broker; all at
once on a broker that then stops; pointed at an address nobody serves."""


@dataclass(frozen=True)
class Case:
    """One command to interrupt."""

    name: str
    argv: list[str]
    ready: str
    """Regex on its output that says it is at work ('': wait ``settle_s``)."""
    settle_s: float
    """Interrupt after this long if ``ready`` never matched."""


def _cases(bootstrap: str, work: Path, trace: Path) -> list[Case]:
    work.mkdir(parents=True, exist_ok=True)

    def agent(name: str, kafka: str) -> Case:
        # the agent simulates its host's whole run before shipping: keep it short
        sim = f"{SIM.replace('600', '60')} --truth {work / name}.json"
        argv = ["agent", "--job-id", name, "--host", "node0000",
                "--source", "sim", "--sim-args", sim,
                "--bootstrap", kafka, "--spool-dir", str(work / name)]  # fmt: skip
        return Case(f"agent{'' if kafka == bootstrap else ' (Kafka unreachable)'}",
                    argv, r"simulated .* for host", 60.0)  # fmt: skip

    worker = ["streams", "worker", "--bootstrap", bootstrap, "--app-id", "ctrlc",
              "--data-dir", str(work / "faust")]  # fmt: skip
    sinks = ["sinks", "--bootstrap", bootstrap, "--prometheus-listen", "127.0.0.1:0"]
    simulate = ["simulate", *SIM.split(), "--kafka", bootstrap, "--job-id", "sim",
                "--truth", str(work / "sim-truth.json")]  # fmt: skip
    demo = ["demo", "--duration", "120", "--workdir", str(work / "demo")]
    return [
        agent("agent-up", bootstrap),
        agent("agent-down", NO_BROKER),
        Case("streams worker", worker, re.escape("[^Worker]: Ready"), 60.0),
        Case("sinks", sinks, r"forwarding", 10.0),
        Case(
            "incidents follow",
            ["incidents", "follow", "--bootstrap", bootstrap],
            r"following incidents",
            10.0,
        ),  # fmt: skip
        Case(
            "replay",
            ["replay", str(trace), "--kafka", bootstrap, "--speed", "1.0"],
            r"replay",
            5.0,
        ),  # fmt: skip
        Case("simulate --kafka", simulate, r"simulat", 5.0),
        Case("demo", demo, r"simulating \d+ ranks", 120.0),
        Case("topics create", ["topics", "create", "--bootstrap", bootstrap], "", 0.0),
    ]


class Running:
    """A command started in a session of its own, its output read as it comes."""

    def __init__(self, case: Case, env: dict[str, str]) -> None:
        self.case = case
        self.proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", "mycroft", *case.argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            text=True,
        )
        self.started = time.monotonic()
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        pattern = re.compile(self.case.ready or "$^", re.IGNORECASE)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if pattern.search(line):
                self.ready.set()

    def wait_ready(self) -> bool:
        """Wait for its ready line (or its settle time); whether it matched."""
        matched = self.ready.wait(self.case.settle_s)
        if matched:
            time.sleep(AT_WORK_S)  # at work, not at its first line
        return matched

    def row(self, **fields: Any) -> dict[str, Any]:
        """The result: its name, ``fields`` and the last lines it printed."""
        self._reader.join(5)
        text = "\n".join(self.lines)
        row = {"name": self.case.name, **fields,
                "traceback": "Traceback (most recent call last)" in text,
                "tail": self.lines[-3:]}  # fmt: skip
        if self.proc.returncode not in (0, 5, 130):  # killed: where it hung
            row["stacks"] = [ln for ln in self.lines if ln.startswith(STACK_LINES)]
        return row

    def interrupt(self, matched: bool, when: str) -> dict[str, Any]:
        """Ctrl-C it; the row with how long it took to exit and its code."""
        if self.proc.poll() is not None:
            return self.row(when=when, error=f"exited {self.proc.returncode} first")
        ran_s = time.monotonic() - self.started
        sent = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            rc = self.proc.wait(KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGABRT)  # faulthandler: every stack
            time.sleep(1.0)
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
        stop_s = time.monotonic() - sent
        row = self.row(when=when, ran_s=round(ran_s, 1), ready_matched=matched,
                       stop_s=round(stop_s, 2), rc=rc)  # fmt: skip
        row["ok"] = stop_s <= GOAL_S and rc == 130 and not row["traceback"]
        return row

    def exited(self, when: str) -> dict[str, Any]:
        """Wait for it to exit on its own (no broker); the row with time and code."""
        try:
            rc = self.proc.wait(KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            return self.interrupt(False, when)
        exit_s = time.monotonic() - self.started
        row = self.row(when=when, exit_s=round(exit_s, 2), rc=rc)
        row["ok"] = rc == 5 and not row["traceback"]  # README: 5 = unreachable
        return row


def _one_at_a_time(cases: list[Case], env: dict[str, str]) -> list[dict[str, Any]]:
    """Each case alone on a live broker: Ctrl-C once it is at work."""
    rows = []
    for case in cases:
        running = Running(case, env)
        rows.append(running.interrupt(running.wait_ready(), "broker up"))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _broker_gone(
    cases: list[Case], broker: KafkaBroker, env: dict[str, str]
) -> list[dict[str, Any]]:
    """All cases at work on ``broker``, which then stops: Ctrl-C each."""
    running = [Running(case, env) for case in cases]
    matched = [r.wait_ready() for r in running]
    broker.stop()
    time.sleep(BROKER_GONE_S)
    rows = []
    for r, m in zip(running, matched, strict=True):
        rows.append(r.interrupt(m, f"broker gone {BROKER_GONE_S:g} s"))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _no_broker(cases: list[Case], env: dict[str, str]) -> list[dict[str, Any]]:
    """Each case pointed at an address nobody serves: exits 5 on its own."""
    rows = []
    for case in cases:
        rows.append(Running(case, env).exited("no broker"))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    return out.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results/ctrl_c.json"))
    ap.add_argument("--only", default="", help="regex of case names to run")
    ap.add_argument("--phase", default="", help="regex of phases to run")
    args = ap.parse_args()
    fetch_jars()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYCROFT_")}
    env["PYTHONUNBUFFERED"] = "1"  # ready lines arrive as printed
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trace = work / "job.trace"
        record = ["simulate", *SIM.split(), "--duration", "120", "--out", str(trace),
                  "--truth", str(work / "truth.json")]  # fmt: skip
        subprocess.run([sys.executable, "-m", "mycroft", *record], check=True, env=env)
        rows = []
        for phase, names in PHASES.items():
            if not re.search(args.phase, phase):
                continue
            here = work / phase.replace(" ", "-")
            kafka = KafkaBroker(here / "broker") if phase != "no broker" else None
            try:
                bootstrap = kafka.start() if kafka else NO_BROKER
                if kafka:
                    create_topics(bootstrap, TopicSet())
                chosen = set(names) & {n for n in names if re.search(args.only, n)}
                cases = [c for c in _cases(bootstrap, here, trace) if c.name in chosen]
                if phase == "broker up":
                    rows += _one_at_a_time(cases, env)
                elif kafka is not None:
                    rows += _broker_gone(cases, kafka, env)
                else:
                    rows += _no_broker(cases, env)
            finally:
                if kafka is not None:
                    kafka.close()
    result = {
        "commit": _commit(),
        "goal_s": GOAL_S,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "cases": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", "utf-8")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
