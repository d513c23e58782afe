"""The plugin under concurrent proxy threads of several communicators, tick thread live.

``fake_nccl --stress T OPS STEPS``: T threads, each its own communicator,
drive OPS AllReduces of 4 flows (send and recv on 2 channels) of STEPS steps
while the plugin's tick thread (1 ms) snapshots and retires them.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from mycroft.producers.ring_layout import Beat, Comm, FlowDone, FlowSteps, OpDone
from tests.unit.nccl.harness import SOURCE, run

THREADS, OPS, STEPS = 4, 300, 5


@pytest.mark.parametrize(("abi", "ops_pool"), [(6, "8192"), (5, "8192"), (4, "256")])
def test_every_op_is_done_or_counted_dropped(
    tmp_path: Path, abi: int, ops_pool: str
) -> None:
    r = run(
        None,
        tmp_path,
        abi,
        env={"MYCROFT_NCCL_TICK_MS": "1", "MYCROFT_NCCL_OPS": ops_pool},
        args=("--stress", str(THREADS), str(OPS), str(STEPS)),
    )
    assert r.corrupt == 0
    assert {c.comm for c in r.of(Comm)} == {0x5000 + t for t in range(THREADS)}
    beat = r.of(Beat)[-1]
    done = r.of(OpDone)
    assert len(done) + beat.dropped_ops == THREADS * OPS
    if ops_pool == "8192":
        assert beat.dropped_ops == 0
    else:
        assert beat.dropped_ops > 0  # 1,200 ops outrun a 256-op pool
    assert beat.dropped_flows == 0 and beat.dropped_comms == 0
    assert Counter(d.nflows for d in done) == {4: len(done)}
    assert len({(d.comm, d.seq) for d in done}) == len(done)
    flows = r.of(FlowDone)
    assert len(flows) == 4 * len(done)
    assert {f.chunks for f in flows} == {STEPS}
    last: dict[tuple[int, int, int, int], FlowSteps] = {}
    for x in r.of(FlowSteps):
        last[(x.comm, x.seq, x.channel, x.direction)] = x
    assert len(last) == len(flows)
    assert {x.nbytes for x in last.values()} == {STEPS * 1000}
    assert {(x.direction, x.posted) for x in last.values()} == {(0, STEPS), (1, STEPS)}
    assert {x.received for x in last.values() if x.direction == 1} == {STEPS}


def test_no_data_race_under_thread_sanitizer(tmp_path: Path) -> None:
    """The stress run, plugin and harness built with -fsanitize=thread."""
    build_dir = tmp_path / "tsan"
    made = subprocess.run(
        ["make", "-s", "-C", str(SOURCE), f"BUILD={build_dir}",
         "CFLAGS=-O1 -g -fsanitize=thread -Wno-tsan"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"no ThreadSanitizer build here: {made.stderr[-300:]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYCROFT_")}
    env.update(
        MYCROFT_NCCL_TICK_MS="1",
        MYCROFT_NCCL_OPS="512",  # small: slots are dropped and reused while ticking
        MYCROFT_NCCL_RING_DIR=str(tmp_path / "rings"),
    )
    run_ = subprocess.run(
        [str(build_dir / "fake_nccl"), str(build_dir / "libnccl-profiler-mycroft.so"),
         "6", "--stress", "4", "300", "4"],
        capture_output=True, text=True, env=env, timeout=240, check=False,
    )  # fmt: skip
    assert "ThreadSanitizer" not in run_.stderr, run_.stderr[-4000:]
    assert run_.returncode == 0
