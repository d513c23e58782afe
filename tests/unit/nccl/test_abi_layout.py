"""The plugin's ABI structs have NCCL's layout (x86-64 / aarch64 LP64).

``producers/nccl/tests/abi_layout.c`` prints ``sizeof``/``offsetof`` of the
structs declared in ``producers/nccl/include/profiler_v{4,5,6}.h``; the
expected values are the layout of NCCL's own declarations
(``plugins/profiler/example/nccl/profiler_v4.h`` .. ``profiler_v6.h``),
as tabulated in ``producers/nccl/README.md``.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess

import pytest

from tests.unit.nccl.harness import build

# Fields at the same place in every version (descriptor union starts at 24).
_COMMON = {
    "ncclProfilerEventStateArgs_{v}_t": 8,
    "ncclProfiler_{v}_t": 48,
    "ncclProfilerEventDescr_{v}_t.parentObj": 8,
    "ncclProfilerEventDescr_{v}_t.rank": 16,
    "ncclProfilerEventDescr_{v}_t.coll.seqNumber": 24,
    "ncclProfilerEventDescr_{v}_t.coll.datatype": 72,
    "ncclProfilerEventDescr_{v}_t.coll.nChannels": 80,
    "ncclProfilerEventDescr_{v}_t.coll.algo": 88,
    "ncclProfilerEventDescr_{v}_t.coll.proto": 96,
    "ncclProfilerEventDescr_{v}_t.p2p.peer": 56,
    "ncclProfilerEventDescr_{v}_t.p2p.nChannels": 60,
    "ncclProfilerEventDescr_{v}_t.proxyOp.pid": 24,
    "ncclProfilerEventDescr_{v}_t.proxyOp.channelId": 28,
    "ncclProfilerEventDescr_{v}_t.proxyOp.peer": 32,
    "ncclProfilerEventDescr_{v}_t.proxyOp.nSteps": 36,
    "ncclProfilerEventDescr_{v}_t.proxyOp.chunkSize": 40,
    "ncclProfilerEventDescr_{v}_t.proxyOp.isSend": 44,
    "ncclProfilerEventDescr_{v}_t.proxyStep.step": 24,
    "ncclProfilerEventDescr_{v}_t.kernelCh.channelId": 24,
    "ncclProfilerEventDescr_{v}_t.kernelCh.pTimer": 32,
    "ncclProfiler_{v}_t.init": 8,
    "ncclProfiler_{v}_t.startEvent": 16,
    "ncclProfiler_{v}_t.stopEvent": 24,
    "ncclProfiler_{v}_t.recordEventState": 32,
    "ncclProfiler_{v}_t.finalize": 40,
}
# v4's Coll has no parentGroup (104 bytes); v5 and v6 add it at 104 (112 bytes).
_PER_VERSION = {
    "v4": {"ncclProfilerEventDescr_v4_t": 104},
    "v5": {
        "ncclProfilerEventDescr_v5_t": 112,
        "ncclProfilerEventDescr_v5_t.coll.parentGroup": 104,
        "ncclProfilerEventDescr_v5_t.p2p.parentGroup": 64,
    },
    "v6": {
        "ncclProfilerEventDescr_v6_t": 112,
        "ncclProfilerEventDescr_v6_t.ceColl.stream": 104,
        "ncclProfilerEventDescr_v6_t.ceCollBatch.totalBytes": 32,
    },
}


def _measured() -> dict[str, int]:
    out = subprocess.run(
        [str(build() / "abi_layout")], capture_output=True, text=True, check=True
    ).stdout
    return {
        name: int(value) for _, name, value in (ln.split() for ln in out.splitlines())
    }


@pytest.mark.parametrize("version", ["v4", "v5", "v6"])
def test_layout_matches_nccl(version: str) -> None:
    expected = {k.format(v=version): n for k, n in _COMMON.items()}
    expected.update(_PER_VERSION[version])
    got = _measured()
    assert {k: got.get(k) for k in expected} == expected


def _glibc_versions(objdump_t: str) -> set[tuple[int, ...]]:
    """The ``GLIBC_x.y[.z]`` symbol versions an ``objdump -T`` listing asks for."""
    found = re.findall(r"\(GLIBC_(\d+(?:\.\d+)+)\)", objdump_t)
    return {tuple(int(p) for p in v.split(".")) for v in found}


@pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("objdump") is None,
    reason="the symbol versions are pinned for x86-64 glibc (objdump reads them)",
)
def test_the_library_loads_on_glibc_2_17() -> None:
    """The .so built here asks for no glibc symbol newer than 2.17, so it loads in
    an older training image (the 2.34 pthread/dl symbols are bound to 2.2.5)."""
    so = build() / "libnccl-profiler-mycroft.so"
    out = subprocess.run(
        ["objdump", "-T", str(so)], capture_output=True, text=True, check=True
    ).stdout
    versions = _glibc_versions(out)
    assert versions, "objdump found no GLIBC symbol versions"
    assert max(versions) <= (2, 17), sorted(versions)
    assert _glibc_versions("x (GLIBC_2.34) pthread_once") == {(2, 34)}
