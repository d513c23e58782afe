"""Drives the NCCL profiler plugin through the fake-NCCL harness (not a test module).

``build()`` runs ``make -C producers/nccl`` into a private build directory once
per session; ``Script`` writes the harness's event script in NCCL's proxy
order (``producers/nccl/tests/fake_nccl.c`` documents the lines); ``run``
executes it against the built ``.so`` with the tick thread off and returns
every record the Python ``RingReader`` reads back from the ring.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from mycroft.producers.ring import RingReader
from mycroft.producers.ring_layout import RingHeader, RingRecord
from tests.services import unavailable

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "producers" / "nccl"

# NCCL's ncclProfilerEventState_t values (plugins/profiler/example/nccl/profiler.h)
SEND_GPU_WAIT, SEND_WAIT, RECV_WAIT, RECV_FLUSH_WAIT, RECV_GPU_WAIT = 8, 9, 10, 11, 12
SEND_PEER_WAIT, KERNEL_CH_STOP = 20, 22


@functools.cache
def build() -> Path:
    """Build the plugin and the harness once; return the build directory."""
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
        unavailable("C toolchain", "make and cc are needed to build the plugin")
    out = Path(tempfile.mkdtemp(prefix="mycroft-nccl-build-"))
    atexit.register(shutil.rmtree, out, True)
    proc = subprocess.run(
        ["make", "-s", "-C", str(SOURCE), f"BUILD={out}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"make failed:\n{proc.stdout}\n{proc.stderr}")
    return out


@dataclass
class Script:
    """An event script; every start returns the id that names its handle."""

    lines: list[str] = field(default_factory=list)
    next_id: int = 1

    def _new(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def init(  # noqa: PLR0917 - the init arguments of NCCL's profiler ABI
        self, cid: int, comm_hash: int, nranks: int, rank: int, nnodes: int, name: str
    ) -> None:
        """``init`` of communicator slot ``cid``."""
        self.lines.append(f"init {cid} {comm_hash:#x} {nranks} {rank} {nnodes} {name}")

    def coll(  # noqa: PLR0917 - the Coll descriptor's fields
        self,
        cid: int,
        seq: int,
        count: int,
        nch: int,
        func: str = "AllReduce",
        dtype: str = "ncclFloat32",
        algo: str = "RING",
        proto: str = "SIMPLE",
    ) -> int:
        """Start a Coll event."""
        h = self._new()
        self.lines.append(
            f"coll {h} {cid} {seq} {func} {count} {dtype} {algo} {proto} {nch}"
        )
        return h

    def p2p(self, cid: int, func: str, peer: int, count: int) -> int:
        """Start a P2p event (``func`` Send or Recv)."""
        h = self._new()
        self.lines.append(f"p2p {h} {cid} {func} {peer} {count} ncclFloat32")
        return h

    def proxyop(  # noqa: PLR0917 - the ProxyOp descriptor's fields
        self,
        parent: int,
        channel: int,
        peer: int,
        nsteps: int,
        send: bool,
        pid: int | None = None,
    ) -> int:
        """Start a ProxyOp (``pid`` other than the harness's: a PXN op)."""
        h = self._new()
        tail = f" {pid}" if pid is not None else ""
        self.lines.append(
            f"proxyop {h} {parent} {channel} {peer} {nsteps} {int(send)}{tail}"
        )
        return h

    def step(self, parent: int, step: int) -> int:
        """Start a ProxyStep."""
        h = self._new()
        self.lines.append(f"step {h} {parent} {step}")
        return h

    def kch(self, parent: int, channel: int) -> int:
        """Start a KernelCh event."""
        h = self._new()
        self.lines.append(f"kch {h} {parent} {channel}")
        return h

    def state(self, h: int, state: int, trans_size: int = 0) -> None:
        """recordEventState with ``transSize``."""
        self.lines.append(f"state {h} {state} {trans_size}")

    def stop(self, h: int) -> None:
        """stopEvent."""
        self.lines.append(f"stop {h}")

    def flush(self) -> None:
        """Make the plugin write everything pending (one tick)."""
        self.lines.append("flush")

    def sleep(self, ms: int) -> None:
        """Pause the script ``ms`` milliseconds (real time, for the tick thread)."""
        self.lines.append(f"sleep {ms}")

    def tick(self) -> None:
        """One timed tick, as the plugin's tick thread runs it."""
        self.lines.append("tick")

    def send_step(  # noqa: PLR0917 - a step's stages and its stale sizes
        self,
        flow: int,
        step: int,
        upto: int = 4,
        nbytes: int = 4096,
        retries: int = 0,
        stale: int = 0,
    ) -> int:
        """One send step as net.cc drives it, through ``upto`` of its 4 stages.

        Stages: 1 SendGPUWait, 2 SendPeerWait (repeated ``retries`` more times,
        an isend retried), 3 SendWait with ``nbytes``, 4 stop. Every state but
        SendWait carries the stale ``transSize`` ``stale``.
        """
        h = self.step(flow, step)
        if upto >= 1:
            self.state(h, SEND_GPU_WAIT, stale)
        if upto >= 2:
            for _ in range(1 + retries):
                self.state(h, SEND_PEER_WAIT, stale)
        if upto >= 3:
            self.state(h, SEND_WAIT, nbytes)
        if upto >= 4:
            self.stop(h)
        return h

    def recv_step(  # noqa: PLR0917 - a step's stages and its stale size
        self, flow: int, step: int, upto: int = 4, nbytes: int = 4096, stale: int = 0
    ) -> int:
        """One recv step: RecvWait, RecvFlushWait (``nbytes``), RecvGPUWait, stop."""
        h = self.step(flow, step)
        if upto >= 1:
            self.state(h, RECV_WAIT, stale)
        if upto >= 2:
            self.state(h, RECV_FLUSH_WAIT, nbytes)
        if upto >= 3:
            self.state(h, RECV_GPU_WAIT, stale)
        if upto >= 4:
            self.stop(h)
        return h

    def text(self) -> str:
        """The script as the harness reads it."""
        return "\n".join(self.lines) + "\n"


@dataclass
class Run:
    """What one harness run left: its output and the ring read back."""

    stdout: str
    stderr: str
    header: RingHeader | None
    records: list[RingRecord]
    corrupt: int
    rings: int

    def of(self, cls: type[T]) -> list[T]:
        """Records of one type, in ring order."""
        return [r for r in self.records if isinstance(r, cls)]


def run(
    script: Script | None,
    tmp: Path,
    abi: int = 6,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> Run:
    """Run ``script`` (or harness mode ``args``) against the plugin; read the ring."""
    build_dir = build()
    ring_dir = tmp / f"ring-{abi}-{len(list(tmp.iterdir()))}"
    full = {
        k: v for k, v in os.environ.items() if not k.startswith(("MYCROFT_", "RANK"))
    }
    full.update({"MYCROFT_NCCL_TICK_MS": "0", "MYCROFT_NCCL_RING_DIR": str(ring_dir)})
    full.update(env or {})
    proc = subprocess.run(
        [
            str(build_dir / "fake_nccl"),
            str(build_dir / "libnccl-profiler-mycroft.so"),
            str(abi),
            *args,
        ],
        input=script.text() if script else "",
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rings = sorted(ring_dir.glob("*.ring")) if ring_dir.is_dir() else []
    if not rings:
        return Run(proc.stdout, proc.stderr, None, [], 0, 0)
    reader = RingReader(rings[0], flow_steps=True)
    try:
        records = reader.poll()
        return Run(
            proc.stdout, proc.stderr, reader.header, records, reader.corrupt, len(rings)
        )
    finally:
        reader.close()
