"""Ctrl-C (SIGINT) stops the agent promptly, exit 130, its records kept in the spool.

With Kafka unreachable nothing is acknowledged; the agent must not wait its
SIGTERM flush time (10 s) for deliveries that cannot come. How fast it stops
is measured by hand in the closing notes; this checks that it stops, keeps
every record and says so.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_sigint_exits_130_and_keeps_the_spool(tmp_path: Path) -> None:
    sim = f"--ranks 8 --tp 8 --duration 20 --truth {tmp_path / 't.json'}"
    argv = [sys.executable, "-m", "mycroft", "agent", "--source", "sim",
            "--sim-args", sim, "--bootstrap", "127.0.0.1:1",
            "--spool-dir", str(tmp_path / "spool"), "--host", "node0"]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # until the agent ticks: the sim trace is written
        lines.append(line)
        if "sim-node0.trace" in line:
            break
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    proc.wait(timeout=60)
    waited = time.monotonic() - sent
    err = "".join(lines) + proc.stderr.read()
    proc.stderr.close()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    kept = re.search(r"0 sent, (\d+) left in the spool", err)
    assert kept and int(kept.group(1)) > 0, err
    assert waited < 10.0, f"stopped {waited:.1f} s after SIGINT"
