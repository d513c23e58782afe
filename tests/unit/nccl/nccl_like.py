"""Drives the NCCL profiler plugin through ``nccl_like`` (not a test module).

``Scenario`` writes what an application does at NCCL's level (create a
communicator, run an AllReduce, capture and replay a graph, abort, destroy);
``producers/nccl/tests/nccl_like.c`` documents the lines and the NCCL source
each step follows. ``run`` executes a scenario (or the driver's ``--rate``
mode) against the plugin under one NCCL release family and reads every ring
the plugin left, one per device.

``MYCROFT_TEST_NCCL_PLUGIN`` points the tests at another build of the plugin.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from mycroft.producers.ring_layout import (
    HEADER_SIZE,
    SLOT_SIZE,
    U64,
    WRITE_IDX_OFFSET,
    Beat,
    Kind,
    OpDone,
    OpIssued,
    RingHeader,
    RingRecord,
    decode_slot,
)
from tests.unit.nccl.harness import build

T = TypeVar("T")

RELEASES = ("2.27", "2.28", "2.29", "2.30")
"""NCCL release families whose loader and event glue differ (2.30 is 2.30.3+)."""

# Variables through which the plugin reads its settings, rank or world size.
_ENV_PREFIXES = ("MYCROFT_", "NCCL_", "OMPI_COMM_WORLD_", "PMI_", "SLURM_")
_ENV_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MPI_LOCALRANKID"}
_DEVICE = re.compile(r"-d(\d+)-")
_INIT_LINE = re.compile(
    r"^init (\S+) rc=(-?\d+) mask=(-?\d+) ctx=(\d) refcount=(-?\d+)$", re.M
)


def plugin_path() -> Path:
    """The plugin under test: ``MYCROFT_TEST_NCCL_PLUGIN`` or the fresh build."""
    given = os.environ.get("MYCROFT_TEST_NCCL_PLUGIN")
    return Path(given) if given else build() / "libnccl-profiler-mycroft.so"


def _words(cmd: str, args: tuple[object, ...], opts: dict[str, object]) -> str:
    parts = [cmd, *map(str, args)]
    parts += [f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in opts.items()]
    return " ".join(parts)


@dataclass
class Scenario:
    """An application's NCCL calls, one scenario line each."""

    lines: list[str] = field(default_factory=list)

    def add(self, cmd: str, *args: object, **opts: object) -> Scenario:
        """Append one line: ``cmd`` with positional words and ``key=value`` options."""
        self.lines.append(_words(cmd, args, opts))
        return self

    def comm(self, name: str, **opts: object) -> Scenario:
        """``ncclCommInitRank`` (``share=PARENT``: a split sharing its proxy thread)."""
        return self.add("comm", name, **opts)

    def comms(self, *names: str, **opts: object) -> Scenario:
        """``ncclCommInitAll``: one rank per device, inits running at once."""
        return self.add("comms", *names, **opts)

    def allreduce(self, comm: str, **opts: object) -> Scenario:
        """``ncclAllReduce``; options: count dtype algo proto nch steps net, faults."""
        return self.add("allreduce", comm, **opts)

    def allgather(self, comm: str, **opts: object) -> Scenario:
        """``ncclAllGather``."""
        return self.add("allgather", comm, **opts)

    def reducescatter(self, comm: str, **opts: object) -> Scenario:
        """``ncclReduceScatter``."""
        return self.add("reducescatter", comm, **opts)

    def broadcast(self, comm: str, **opts: object) -> Scenario:
        """``ncclBroadcast``."""
        return self.add("broadcast", comm, **opts)

    def send(self, comm: str, peer: int, **opts: object) -> Scenario:
        """``ncclSend``."""
        return self.add("send", comm, peer=peer, **opts)

    def recv(self, comm: str, peer: int, **opts: object) -> Scenario:
        """``ncclRecv``."""
        return self.add("recv", comm, peer=peer, **opts)

    def capture(self, graph: str) -> Scenario:
        """Begin capturing a CUDA graph: the next ops are recorded into it."""
        return self.add("capture", graph)

    def end_capture(self) -> Scenario:
        """End the capture."""
        return self.add("endcapture")

    def replay(self, graph: str, times: int = 1) -> Scenario:
        """Launch the graph ``times`` times (plans run on the host-callback thread)."""
        return self.add("replay", graph, times=times)

    def wait(self) -> Scenario:
        """Until the proxy and callback threads have nothing left to do."""
        return self.add("wait")

    def tick(self) -> Scenario:
        """One timed tick of the plugin (``mycroftNcclTick``)."""
        return self.add("tick")

    def flush(self) -> Scenario:
        """Make the plugin write everything pending (``mycroftNcclFlush``)."""
        return self.add("flush")

    def sleep(self, ms: int) -> Scenario:
        """Pause the application thread ``ms`` milliseconds."""
        return self.add("sleep", ms)

    def mark(self, label: str) -> Scenario:
        """Print the wall clock (``CLOCK_REALTIME`` ns) under ``label``."""
        return self.add("mark", label)

    def release(self, comm: str) -> Scenario:
        """Let the held kernel channels of ``comm``'s ops start."""
        return self.add("release", comm)

    def destroy(self, comm: str) -> Scenario:
        """``ncclCommDestroy``."""
        return self.add("destroy", comm)

    def abort(self, comm: str) -> Scenario:
        """``ncclCommAbort``."""
        return self.add("abort", comm)

    def text(self) -> str:
        """The scenario as the driver reads it."""
        return "\n".join(self.lines) + "\n"


@dataclass(frozen=True)
class Ring:
    """One ring file read back: the plugin writes one per device."""

    device: int
    header: RingHeader
    records: list[RingRecord]
    corrupt: int
    overwritten: int


_SEQ_WORDS = struct.Struct("<Q56x")


class _Follower:
    """Copies a ring's new slots while the writer runs, as the agent drains it;
    decodes them afterwards (decoding at 400k records/s would lag on 2 cores)."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as fh:
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self.header = RingHeader.unpack(self._mm[:HEADER_SIZE])
        self._next = 0
        self._chunks: list[tuple[int, bytes, int]] = []
        self.overwritten = 0

    def poll(self) -> None:
        (w,) = U64.unpack_from(self._mm, WRITE_IDX_OFFSET)
        n = self.header.nslots
        if w - self._next > n:
            self.overwritten += w - n - self._next
            self._next = w - n
        while self._next < w:
            slot = self._next % n
            end = min(w, self._next + n - slot)
            lo = HEADER_SIZE + slot * SLOT_SIZE
            copy = self._mm[lo : lo + (end - self._next) * SLOT_SIZE]
            (after,) = U64.unpack_from(self._mm, WRITE_IDX_OFFSET)
            # records older than after - n may have been rewritten while copied
            self._chunks.append((self._next, copy, after - n))
            self._next = end

    def ring(self, device: int, kinds: frozenset[Kind] | None) -> Ring:
        self.poll()
        records: list[RingRecord] = []
        corrupt = 0
        for first, chunk, torn_below in self._chunks:
            for i, (word,) in enumerate(_SEQ_WORDS.iter_unpack(chunk)):
                if word != 2 * (first + i) + 2 or first + i < torn_below:
                    self.overwritten += 1  # the writer lapped the copy
                    continue
                slot = chunk[i * SLOT_SIZE : (i + 1) * SLOT_SIZE]
                if kinds is not None and slot[8] not in kinds:
                    continue
                _, record = decode_slot(slot)
                if record is None:
                    corrupt += 1
                else:
                    records.append(record)
        self._mm.close()
        return Ring(device, self.header, records, corrupt, self.overwritten)


@dataclass(frozen=True)
class Init:
    """What one communicator's init returned, as the driver printed it."""

    rc: int
    mask: int
    ctx: bool
    refcount: int


@dataclass
class Run:
    """One driver run: its output, its inits and marks, and the rings read back."""

    returncode: int
    stdout: str
    stderr: str
    rings: dict[int, Ring]

    def of(self, cls: type[T], device: int | None = None) -> list[T]:
        """Records of one type, in ring order (all rings unless ``device``)."""
        rings = [self.rings[device]] if device is not None else self.rings.values()
        return [r for ring in rings for r in ring.records if isinstance(r, cls)]

    def beat(self, device: int = 0) -> Beat:
        """The newest BEAT of a device's ring."""
        beats = self.of(Beat, device)
        assert beats, f"no BEAT in the ring of device {device}"
        return beats[-1]

    @property
    def inits(self) -> dict[str, Init]:
        """Each communicator's init result, by name (the last one if repeated)."""
        out: dict[str, Init] = {}
        for m in _INIT_LINE.finditer(self.stdout):
            out[m[1]] = Init(int(m[2]), int(m[3]), m[4] == "1", int(m[5]))
        return out

    @property
    def marks(self) -> dict[str, int]:
        """Wall-clock marks in ns, by label."""
        return {
            m[1]: int(m[2])
            for m in re.finditer(r"^mark (\S+) (\d+)$", self.stdout, re.M)
        }

    @property
    def summary(self) -> dict[str, float]:
        """The JSON line ``--rate`` prints."""
        line = next(x for x in self.stdout.splitlines() if x.startswith("{"))
        return dict(json.loads(line))

    def ops(self, comm: int | None = None) -> tuple[list[OpIssued], list[OpDone]]:
        """OP_ISSUED and OP_DONE records, of one ring communicator id or all."""
        issued = [o for o in self.of(OpIssued) if comm is None or o.comm == comm]
        done = [o for o in self.of(OpDone) if comm is None or o.comm == comm]
        return issued, done


def _follow(
    proc: subprocess.Popen[str],
    ring_dir: Path,
    timeout_s: float,
    kinds: frozenset[Kind] | None,
) -> dict[int, Ring]:
    """Drain every ring of ``ring_dir`` until ``proc`` exits; the rings by device."""
    followers: dict[Path, _Follower] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        done = proc.poll() is not None
        for path in sorted(ring_dir.glob("*.ring")) if ring_dir.is_dir() else []:
            if path not in followers:
                followers[path] = _Follower(path)
        for f in followers.values():
            f.poll()
        if done:
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"nccl_like ran past {timeout_s} s")
        time.sleep(0.02)
    rings: dict[int, Ring] = {}
    for path, f in followers.items():
        m = _DEVICE.search(path.name)
        device = int(m[1]) if m else 0
        rings[device] = f.ring(device, kinds)
    return rings


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_ENV_PREFIXES) and k not in _ENV_NAMES
    }


@dataclass(frozen=True)
class Binaries:
    """A driver and the plugin it loads."""

    driver: Path
    plugin: Path

    @classmethod
    def default(cls) -> Binaries:
        """The fresh build's driver with ``plugin_path()``."""
        return cls(build() / "nccl_like", plugin_path())


def run(  # noqa: PLR0913 - a run's inputs
    scenario: Scenario | None,
    tmp: Path,
    release: str = "2.30",
    *,
    env: dict[str, str] | None = None,
    tick_ms: int | None = 0,
    args: tuple[str, ...] = (),
    binaries: Binaries | None = None,
    kinds: frozenset[Kind] | None = None,
    timeout_s: float = 120,
) -> Run:
    """Run ``scenario`` (or the driver mode ``args``) under ``release``; read the rings.

    ``tick_ms=0`` (the default) stops the plugin's tick thread: the scenario
    ticks and flushes itself; ``None`` leaves the plugin's own default.
    ``kinds``: decode only these record kinds (every slot is still checked
    for overwrites).
    """
    bins = binaries or Binaries.default()
    ring_dir = tmp / f"rings-{len(list(tmp.iterdir()))}"
    full = _clean_env()
    full["MYCROFT_NCCL_RING_DIR"] = str(ring_dir)
    if tick_ms is not None:
        full["MYCROFT_NCCL_TICK_MS"] = str(tick_ms)
    full.update(env or {})
    script = tmp / f"{ring_dir.name}.txt"
    script.write_text(scenario.text() if scenario else "")
    out, err = tmp / f"{ring_dir.name}.out", tmp / f"{ring_dir.name}.err"
    with script.open() as stdin, out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [str(bins.driver), str(bins.plugin), "--release", release, *args],
            stdin=stdin, stdout=stdout, stderr=stderr, env=full, text=True,
        )  # fmt: skip
        rings = _follow(proc, ring_dir, timeout_s, kinds)
    return Run(proc.returncode, out.read_text(), err.read_text(), rings)


def check(run_: Run) -> Run:
    """Assert the driver saw NCCL's side stay sound (exit 0, no ERROR)."""
    errors = [x for x in run_.stderr.splitlines() if "ERROR" in x]
    assert run_.returncode == 0, "\n".join(errors[:8]) or run_.stderr[-3000:]
    for ring in run_.rings.values():
        assert (ring.corrupt, ring.overwritten) == (0, 0), ring.header
    return run_
