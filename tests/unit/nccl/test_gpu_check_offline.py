"""The GPU check (``producers/nccl/gpu_check.sh``) on a machine without a GPU.

The script's exit codes for a machine with no GPU, no NCCL or an NCCL older
than 2.27; its whole run with a stand-in for NCCL and the CUDA runtime
(``FAKE_GPU_C``: a library that raises the profiler events NCCL would for
each call of ``gpu_nccl_job.c``, into the real plugin); and the stdlib ring
checker on those rings, damaged in several ways.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import ModuleType

import pytest

from mycroft.producers import ring_layout as rl
from mycroft.producers.ring import RingReader, RingWriter
from tests.unit.nccl.harness import build

ROOT = Path(__file__).resolve().parents[3]
NCCL = ROOT / "producers" / "nccl"
SCRIPT = NCCL / "gpu_check.sh"
CHECKER = NCCL / "tests" / "gpu_ring_check.py"

FAKE_GPU_C = r"""
/* A stand-in for libnccl.so.2 and libcudart.so without a GPU: each collective, send and recv
 * raises the profiler events NCCL's proxy would (Coll/P2p, a send and a recv ProxyOp of two
 * network steps, KernelCh), on the calling thread; a CUDA graph replays what it captured.
 * seqNumber counts per collective function, as NCCL's does. FAKE_NCCL_VERSION sets
 * ncclGetVersion; FAKE_HIDE_BROADCAST drops Broadcast's events, as NCCL 2.29+ does;
 * FAKE_FAIL_WITH_PROFILER makes rank 1 exit and rank 0 hang once a profiler is loaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "profiler_v6.h"

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm { uint64_t hash; int nranks, rank, splits; uint64_t seq[4]; void *ctx; } comm_t;
typedef struct { comm_t *c; const char *func, *dtype; size_t count; int peer; } op_t;
typedef struct { op_t ops[64]; int n; } graph_t;
static const char *const FUNCS[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast"};

static ncclProfiler_v6_t *prof;
static int prof_tried;
static graph_t *capturing;

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                   const char *fmt, ...) {
  (void)flags, (void)file, (void)line;
  const char *dbg = getenv("NCCL_DEBUG");
  if (level != NCCL_LOG_WARN && !(dbg && !strcmp(dbg, "INFO"))) return;
  va_list ap;
  va_start(ap, fmt);
  printf("fake NCCL %s ", level == NCCL_LOG_WARN ? "WARN" : "INFO");
  vprintf(fmt, ap);
  putchar('\n');
  va_end(ap);
}

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ULL;
  return h;
}

static comm_t *new_comm(uint64_t hash, int nranks, int rank) {
  comm_t *c = calloc(1, sizeof(*c));
  c->hash = hash, c->nranks = nranks, c->rank = rank;
  if (!prof_tried) {
    prof_tried = 1;
    const char *p = getenv("NCCL_PROFILER_PLUGIN");
    void *h = p && *p && strcmp(p, "none") ? dlopen(p, RTLD_NOW | RTLD_LOCAL) : NULL;
    prof = h ? dlsym(h, "ncclProfiler_v6") : NULL;
    if (prof) logger(NCCL_LOG_INFO, 0, "", 0, "PROFILER/Plugin: Loaded %s (v6)", prof->name);
  }
  if (prof && getenv("FAKE_FAIL_WITH_PROFILER")) {
    if (rank == 1) exit(3);
    sleep(60);
  }
  int mask = 0;
  if (prof && prof->init(&c->ctx, hash, &mask, "", nranks, nranks, rank, logger) != ncclSuccess)
    logger(NCCL_LOG_INFO, 0, "", 0, "Profiler init failed. Continue without profiler.");
  return c;
}

static void *start(comm_t *c, ncclProfilerEventDescr_v6_t *d) {
  void *h = NULL;
  d->rank = c->rank;
  if (prof && c->ctx) prof->startEvent(c->ctx, &h, d);
  return h;
}
static void state(void *h, int st, size_t bytes) {
  ncclProfilerEventStateArgs_v6_t a;
  memset(&a, 0, sizeof(a));
  a.proxyStep.transSize = bytes;
  if (h) prof->recordEventState(h, st, &a);
}
static void stop(void *h) { if (h) prof->stopEvent(h); }

static void proxy(comm_t *c, void *op, int send, int peer, size_t bytes) {
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof(d));
  d.type = MYC_EV_PROXY_OP, d.parentObj = op, d.proxyOp.pid = getpid();
  d.proxyOp.peer = peer, d.proxyOp.nSteps = 2, d.proxyOp.isSend = send;
  void *f = start(c, &d);
  for (int s = 0; s < 2; s++) {
    memset(&d, 0, sizeof(d));
    d.type = MYC_EV_PROXY_STEP, d.parentObj = f, d.proxyStep.step = s;
    void *h = start(c, &d);
    if (send) {
      state(h, MYC_ST_SEND_GPU_WAIT, 0), state(h, MYC_ST_SEND_PEER_WAIT, 0);
      state(h, MYC_ST_SEND_WAIT, bytes / 2 + 1);
    } else {
      state(h, MYC_ST_RECV_WAIT, 0), state(h, MYC_ST_RECV_FLUSH_WAIT, bytes / 2 + 1);
      state(h, MYC_ST_RECV_GPU_WAIT, 0);
    }
    stop(h);
  }
  stop(f);
}

static void emit(const op_t *o) {
  comm_t *c = o->c;
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof(d));
  size_t bytes = o->count * (strcmp(o->dtype, "ncclInt8") ? 4 : 1);
  if (o->peer < 0) {
    int f = 0;
    while (strcmp(FUNCS[f], o->func)) f++;
    d.type = MYC_EV_COLL, d.coll.seqNumber = c->seq[f]++, d.coll.func = o->func;
    d.coll.count = o->count, d.coll.datatype = o->dtype, d.coll.nChannels = 1;
    d.coll.algo = "RING", d.coll.proto = "SIMPLE";
  } else {
    d.type = MYC_EV_P2P, d.p2p.func = o->func, d.p2p.peer = o->peer, d.p2p.count = o->count;
    d.p2p.datatype = o->dtype, d.p2p.nChannels = 1;
  }
  void *op = start(c, &d);
  memset(&d, 0, sizeof(d));
  d.type = MYC_EV_KERNEL_CH, d.parentObj = op;
  void *kch = start(c, &d);
  int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
  if (o->peer < 0 || !strcmp(o->func, "Send")) proxy(c, op, 1, o->peer < 0 ? next : o->peer, bytes);
  if (o->peer < 0 || !strcmp(o->func, "Recv")) proxy(c, op, 0, o->peer < 0 ? prev : o->peer, bytes);
  stop(op);
  state(kch, MYC_ST_KERNEL_CH_STOP, 0);
  stop(kch);
}

static ncclResult_t issue(comm_t *c, const char *func, size_t count, const char *dtype, int peer) {
  op_t o = {c, func, dtype, count, peer};
  if (capturing && capturing->n < 64)
    capturing->ops[capturing->n++] = o;
  else
    emit(&o);
  return ncclSuccess;
}

ncclResult_t ncclGetVersion(int *v) {
  *v = getenv("FAKE_NCCL_VERSION") ? atoi(getenv("FAKE_NCCL_VERSION")) : 23007;
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  memset(id, 0, sizeof(*id));
  snprintf(id->internal, sizeof(id->internal), "%d-%ld-%ld", (int)getpid(), (long)ts.tv_sec, ts.tv_nsec);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(comm_t **c, int nranks, ncclUniqueId id, int rank) {
  *c = new_comm(fnv(&id, sizeof(id), 0xcbf29ce484222325ULL), nranks, rank);
  return ncclSuccess;
}
ncclResult_t ncclCommSplit(comm_t *p, int color, int key, comm_t **c, void *config) {
  (void)color, (void)config;
  p->splits++;
  *c = new_comm(fnv(&p->splits, sizeof(p->splits), p->hash), p->nranks, key);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(comm_t *c) {
  if (prof && c->ctx) prof->finalize(c->ctx);
  free(c);
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op, comm_t *c, void *st) {
  (void)s, (void)r, (void)t, (void)op, (void)st;
  return issue(c, "AllReduce", n, "ncclFloat32", -1);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int t, comm_t *c, void *st) {
  (void)s, (void)r, (void)t, (void)st;
  return issue(c, "AllGather", n * 4, "ncclInt8", -1);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, comm_t *c, void *st) {
  (void)s, (void)r, (void)t, (void)op, (void)st;
  return issue(c, "ReduceScatter", n, "ncclFloat32", -1);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int t, int root, comm_t *c, void *st) {
  (void)s, (void)r, (void)t, (void)root, (void)st;
  return getenv("FAKE_HIDE_BROADCAST") ? ncclSuccess : issue(c, "Broadcast", n * 4, "ncclInt8", -1);
}
ncclResult_t ncclSend(const void *s, size_t n, int t, int peer, comm_t *c, void *st) {
  (void)s, (void)t, (void)st;
  return issue(c, "Send", n, "ncclFloat32", peer);
}
ncclResult_t ncclRecv(void *r, size_t n, int t, int peer, comm_t *c, void *st) {
  (void)r, (void)t, (void)st;
  return issue(c, "Recv", n, "ncclFloat32", peer);
}
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
const char *ncclGetErrorString(ncclResult_t r) { (void)r; return "fake NCCL error"; }

int cudaGetDeviceCount(int *n) { *n = 1; return 0; }
int cudaSetDevice(int d) { return d != 0; }
int cudaMalloc(void **p, size_t n) { return !(*p = malloc(n)); }
int cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return 0; }
int cudaFree(void *p) { free(p); return 0; }
int cudaStreamCreate(void **s) { *s = &capturing; return 0; }
int cudaStreamSynchronize(void *s) { (void)s; return 0; }
int cudaStreamDestroy(void *s) { (void)s; return 0; }
const char *cudaGetErrorString(int e) { (void)e; return "fake CUDA error"; }
int cudaStreamBeginCapture(void *s, int mode) {
  (void)s, (void)mode;
  capturing = calloc(1, sizeof(graph_t));
  return 0;
}
int cudaStreamEndCapture(void *s, void **g) { (void)s; *g = capturing; capturing = NULL; return 0; }
int cudaGraphInstantiateWithFlags(void **e, void *g, unsigned long long f) { (void)f; *e = g; return 0; }
int cudaGraphLaunch(void *e, void *s) {
  (void)s;
  graph_t *g = e;
  for (int i = 0; i < g->n; i++) emit(&g->ops[i]);
  return 0;
}
int cudaGraphExecDestroy(void *e) { (void)e; return 0; }
int cudaGraphDestroy(void *g) { free(g); return 0; }
"""  # noqa: E501 - C source, its own line length


@dataclasses.dataclass(frozen=True)
class Fakes:
    """The stand-in library, stub commands, and a prebuilt plugin to copy."""

    lib: Path
    gpu_bin: Path
    no_gpu_bin: Path
    build: Path

    def env(self, gpu: bool = True, **extra: str) -> dict[str, str]:
        """The environment of a script run against the stand-ins."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("NCCL_", "MYCROFT_"))
        }
        stubs = self.gpu_bin if gpu else self.no_gpu_bin
        env["PATH"] = f"{stubs}{os.pathsep}{env['PATH']}"
        env["PYTHON3"] = sys.executable
        env["MYCROFT_TORCH_PYTHON"] = str(stubs / "no-torch")
        env["MYCROFT_NCCL_LIB"] = env["MYCROFT_CUDART"] = str(self.lib)
        env.update(extra)
        return env


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Fakes:
    """Build the stand-in library; stub nvidia-smi commands with and without a GPU."""
    build_dir = build()  # the plugin, once per session (skips without a C toolchain)
    tmp = tmp_path_factory.mktemp("fake-gpu")
    (tmp / "fake_gpu.c").write_text(FAKE_GPU_C)
    flags = "-std=c11 -O1 -Wall -Wextra -Werror -fPIC -shared".split()
    lib, source = tmp / "libfakegpu.so", tmp / "fake_gpu.c"
    subprocess.run(
        ["cc", *flags, f"-I{NCCL / 'include'}", "-o", str(lib), str(source), "-ldl"],
        check=True,
    )
    gpu_bin, no_gpu_bin = tmp / "gpu-bin", tmp / "no-gpu-bin"
    for folder in (gpu_bin, no_gpu_bin):
        folder.mkdir()
        _stub(folder, "no-torch", "echo torch_error=No module named torch")
    _stub(gpu_bin, "nvidia-smi", 'echo "GPU 0: Fake GPU (UUID: GPU-0000)"')
    _stub(no_gpu_bin, "nvidia-smi", 'echo "No devices were found"; exit 6')
    return Fakes(lib, gpu_bin, no_gpu_bin, build_dir)


def run_script(
    fakes: Fakes, out: Path, env: dict[str, str], churn: int = 2
) -> subprocess.CompletedProcess[str]:
    """Run gpu_check.sh into ``out`` with the plugin already built there."""
    shutil.copytree(fakes.build, out / "build")  # mtimes kept: make finds it up to date
    return subprocess.run(
        ["bash", str(SCRIPT), "--out", str(out), "--churn", str(churn), "--iters", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def good_run(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole run of the check against the stand-ins; its output directory."""
    out = tmp_path_factory.mktemp("gpu-check")
    proc = run_script(fakes, out, fakes.env(), churn=20)  # > the 16 slots it gives
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@functools.cache
def checker() -> ModuleType:
    """``gpu_ring_check.py``, imported by path as the script runs it."""
    spec = importlib.util.spec_from_file_location("gpu_ring_check", CHECKER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_ring_check"] = module  # dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


# ---- the script and the job ----


def test_script_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run(
        ["shellcheck", str(SCRIPT)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


def test_job_builds_without_cuda_or_nccl_headers(tmp_path: Path) -> None:
    exe = tmp_path / "gpu_nccl_job"
    source = NCCL / "tests" / "gpu_nccl_job.c"
    flags = "-std=c11 -Wall -Wextra -Werror".split()
    subprocess.run(["cc", *flags, "-o", str(exe), str(source), "-ldl"], check=True)
    env = dict(os.environ, MYCROFT_NCCL_LIB="/nonexistent/libnccl.so.2")
    probe = subprocess.run(
        [str(exe), "--probe"], capture_output=True, text=True, env=env, check=False
    )
    assert probe.returncode == 0
    assert probe.stdout.startswith("nccl_error=/nonexistent/libnccl.so.2: cannot open")


NOTHING_RAN = {  # environment -> exit status, what the script says
    "no-gpu": (False, {"MYCROFT_CUDART": "/nonexistent/libcudart.so"}, 2, "no GPU"),
    "no-nccl": (True, {"MYCROFT_NCCL_LIB": "/nonexistent/libnccl.so.2"}, 3, "no NCCL"),
    "nccl-2.26": (True, {"FAKE_NCCL_VERSION": "22605"}, 4, "NCCL 2.26.5 (/"),
}


@pytest.mark.parametrize("case", sorted(NOTHING_RAN))
def test_script_says_why_nothing_ran(fakes: Fakes, tmp_path: Path, case: str) -> None:
    gpu, extra, code, says = NOTHING_RAN[case]
    proc = run_script(fakes, tmp_path, fakes.env(gpu, **extra))
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert says in proc.stderr
    assert json.loads((tmp_path / "results.json").read_text())["exit"] == code
    assert not (tmp_path / "on").exists() and not (tmp_path / "off").exists()


def test_whole_check_passes_on_the_stand_ins(good_run: Path) -> None:
    doc = json.loads((good_run / "results.json").read_text())
    assert doc["ok"], [c for c in doc["checks"] if not c["ok"]]
    assert len(doc["checks"]) == 13 and doc["nccl"] == "2.30.7"
    assert len(list((good_run / "on" / "rings").glob("*.ring"))) == 2
    assert not list((good_run / "off" / "rings").iterdir())
    assert "gpu_ring_check: OK" in (good_run / "summary.txt").read_text()
    assert set(doc["overhead"]) == {"131072", "524288", "4194304", "mean_ratio"}
    manifest = json.loads((good_run / "on" / "manifest-0.json").read_text())
    assert manifest["graph"] == {"replays": 5, "bytes": 196608}
    assert (good_run / "build" / "libnccl-profiler-mycroft.so").is_file()


def test_hidden_broadcasts_are_not_taken_for_unseen_ops(
    fakes: Fakes, tmp_path: Path
) -> None:
    """NCCL 2.29+ hides Broadcasts; the plugin must count them in BEAT unseen_ops."""
    proc = run_script(fakes, tmp_path, fakes.env(FAKE_HIDE_BROADCAST="1"))
    assert proc.returncode == 1
    assert "FAIL op mix" in proc.stdout
    assert "12 Broadcasts missing, but BEAT unseen_ops is 0" in proc.stdout


def test_a_rank_failing_with_the_plugin_fails_the_check(
    fakes: Fakes, tmp_path: Path
) -> None:
    """Rank 1 exits, rank 0 hangs in NCCL: the script stops it and says so."""
    t0 = time.monotonic()
    proc = run_script(fakes, tmp_path, fakes.env(FAKE_FAIL_WITH_PROFILER="1"))
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "on: rank 1 exited with 3" in proc.stdout
    assert "the job FAILED with the plugin and passed without it" in proc.stdout
    assert not json.loads((tmp_path / "results.json").read_text())["ok"]


# ---- the ring checker ----


def test_checker_runs_on_a_bare_python(good_run: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(CHECKER),
            str(good_run / "on"),
            "--baseline",
            str(good_run / "off"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _as_fields(record: rl.RingRecord) -> dict[str, object]:
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    del fields["ts_ns"]
    return fields


def _compare(path: Path) -> None:
    mine = [(r.kind, r.ts_ns, r.f) for r in checker().read_ring(path).records]
    reader = RingReader(path, flow_steps=True)
    try:
        theirs = [
            (rl._KIND_OF[type(r)].name, r.ts_ns, _as_fields(r)) for r in reader.poll()
        ]
    finally:
        reader.close()
    assert mine == theirs


def test_decoder_agrees_with_the_ring_reader(good_run: Path) -> None:
    for path in (good_run / "on" / "rings").glob("*.ring"):
        _compare(path)


def test_decoder_reads_every_kind_the_ring_writer_writes(tmp_path: Path) -> None:
    records: list[rl.RingRecord] = [
        rl.Comm(1, 0xC0FFEE, 2, 1, 4, -1),
        rl.OpIssued(2, 0xC0FFEE, 7, 4096, 1, 1, 2, 3, 1, func_seq=5),
        rl.FlowProgress(3, 0xC0FFEE, 7, 1, 0, 1, 8, 6, 5, 4),
        rl.FlowSteps(4, 0xC0FFEE, 7, 1, 0, 1, 7, 123, 8192),
        rl.FlowDone(5, 0xC0FFEE, 7, 2, 1, 0, 1, 8, 17),
        rl.OpDone(6, 0xC0FFEE, 7, 2, 1),
        rl.Beat(7, -1, 1, 2, 3, 4, 5, 6, 7),
        *rl.comm_ranks_records(8, 0xC0FFEE, (3, 9)),
        rl.comm_name_record(9, 0xC0FFEE, "world"),
    ]
    path = tmp_path / "w.ring"
    writer = RingWriter(path, rank=3, nslots=16, version=4)
    for record in records:
        writer.write(record)
    writer.close()
    ring = checker().read_ring(path)
    assert (ring.version, ring.rank, ring.problems) == (4, 3, [])
    _compare(path)


def _slot(path: Path, n: int) -> int:
    """File offset of record ``n`` (no wrap in these rings)."""
    return 128 + 64 * n


def _rewrite(
    path: Path, n: int, offset: int, fmt: str, *values: int, crc: bool = True
) -> None:
    """Change record ``n`` at slot ``offset``; keep its CRC valid unless told not to."""
    data = bytearray(path.read_bytes())
    at = _slot(path, n)
    struct.pack_into(fmt, data, at + offset, *values)
    if crc:
        slot = data[at : at + 64]
        struct.pack_into("<I", slot, 12, 0)
        struct.pack_into("<I", data, at + 12, zlib.crc32(slot))
    path.write_bytes(bytes(data))


def _first(path: Path, kind: str, nth: int = 0) -> int:
    return [r.n for r in checker().read_ring(path).records if r.kind == kind][nth]


def _crc(ring: Path) -> None:
    _rewrite(ring, 5, 30, "<B", 0xFF, crc=False)


def _torn(ring: Path) -> None:
    _rewrite(ring, 9, 0, "<Q", 19, crc=False)


def _past_the_end(ring: Path) -> None:
    """A writer killed after marking the next slot busy: odd seq past write_idx."""
    (written,) = struct.unpack_from("<Q", ring.read_bytes(), 64)
    _rewrite(ring, written, 0, "<Q", 2 * written + 1, crc=False)


def _duplicate_seq(ring: Path) -> None:
    first = checker().read_ring(ring).of("OP_ISSUED")[0]
    _rewrite(
        ring, _first(ring, "OP_ISSUED", 1), 24, "<Qq", first.f["comm"], first.f["seq"]
    )


def _counters_back(ring: Path) -> None:
    _rewrite(ring, _first(ring, "FLOW_PROGRESS"), 52, "<iii", 1, 2, 0)  # G < T


def _dropped(ring: Path) -> None:
    _rewrite(ring, _first(ring, "BEAT", -1), 36, "<I", 3)


def _wrong_rank(ring: Path) -> None:
    data = bytearray(ring.read_bytes())
    struct.pack_into("<i", data, 28, 7)
    ring.write_bytes(bytes(data))


DAMAGE = {
    "crc": (_crc, "ring integrity", "CRC mismatch"),
    "torn": (_torn, "ring integrity", "torn (odd sequence word)"),
    "past-the-end": (_past_the_end, "ring integrity", "written past write_idx"),
    "duplicate-seq": (_duplicate_seq, "op identity", "issued 2 times"),
    "counters-back": (_counters_back, "flow counters", "not total>=G>=T>=D>=0"),
    "dropped": (_dropped, "no drops", "'dropped_ops': 3"),
    "wrong-rank": (_wrong_rank, "one ring per rank", "header says rank 7"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_checker_fails_on_a_damaged_run(
    good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    run = tmp_path / "on"
    shutil.copytree(good_run / "on", run)
    fn, check, says = DAMAGE[damage]
    fn(sorted((run / "rings").glob("*.ring"))[0])
    assert checker().main([str(run), "--json", str(tmp_path / "r.json")]) == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    failed = {c["name"]: c["problems"] for c in doc["checks"] if not c["ok"]}
    assert check in failed, capsys.readouterr().out
    assert any(says in p for p in failed[check]), failed[check]


def test_checker_fails_when_an_op_is_missing(good_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "on"
    shutil.copytree(good_run / "on", run)
    path = run / "manifest-1.json"
    manifest = json.loads(path.read_text())
    manifest["comms"]["split"]["AllReduce 12288"] += 1
    manifest["churn"]["count"] += 1
    path.write_text(json.dumps(manifest))
    assert checker().main([str(run), "--json", str(tmp_path / "r.json")]) == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    failed = {c["name"]: c["problems"] for c in doc["checks"] if not c["ok"]}
    assert set(failed) == {"op mix", "communicator churn"}
    assert (
        "rank 1: 20 of 21 churned communicators profiled"
        in failed["communicator churn"][0]
    )
