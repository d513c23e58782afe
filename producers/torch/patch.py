"""The torch-facing half: thin wrappers around ``torch.distributed`` ops.

Each wrapper resolves the process group (cached per group object), takes the
next op number of that group on this rank, writes OP_ISSUED *before* calling
the original (so an op that aborts inside the backend is still on record),
and writes OP_DONE when the op completed on this rank: when a synchronous
call returns, or when ``wait()`` / ``is_completed()`` of the returned work
says so. Start is taken as the issue time (gloo exposes no better). A call
that raises leaves its op in flight: it never completed.

With the Flight Recorder polled (``frlive``), a collective takes torch's
number for it (``CommRef.next_seq``), so that the poller can tell a wrapped
op from one issued in C++; otherwise each group counts its wrapped ops.
On a NCCL group whose on-completion hook took (``nccl_done``), a
collective's OP_DONE is the GPU's, written by the hook's drain, and the
wrappers write none. Point-to-point ops count on a virtual two-member communicator per
(group, src, dst), so both sides agree on numbers; ``recv`` from any source
(``src=None``) is not traced. An op a traced op calls inside (``recv`` calls
``irecv``) is not recorded again. torch types are ``Any`` at this boundary.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from mycroft.producers.ring_layout import DTYPE_OTHER, DTYPES
from mycroft.producers.torch.frlive import FrConfig, FrPoller, recorder_dumps
from mycroft.producers.torch.nccl_done import GpuCompletions, register
from mycroft.producers.torch.tracer import CommRef, Tracer, comm_hash, p2p_hash
from mycroft.schemas.vocab import OP_NAMES

COLLECTIVES: dict[str, tuple[str, str]] = {
    # torch name: (vocab op name, parameter holding this rank's input)
    "all_reduce": ("allreduce", "tensor"),
    "all_reduce_coalesced": ("allreduce", "tensors"),
    "all_gather": ("allgather", "tensor"),
    "all_gather_into_tensor": ("allgather", "input_tensor"),
    "reduce_scatter": ("reducescatter", "input_list"),
    "reduce_scatter_tensor": ("reducescatter", "input"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "barrier": ("barrier", ""),
    "all_to_all_single": ("alltoall", "input"),
    "all_to_all": ("alltoall", "input_tensor_list"),
    "gather": ("gather", "tensor"),
    "scatter": ("scatter", "tensor"),
}
P2P: dict[str, tuple[str, str, bool]] = {
    # torch name: (vocab op name, peer parameter, returns work)
    "send": ("send", "dst", False),
    "recv": ("recv", "src", False),
    "isend": ("send", "dst", True),
    "irecv": ("recv", "src", True),
}
_DTYPE_CODE = {name: i for i, name in enumerate(DTYPES)}


class _Inside(threading.local):
    """Set while a traced op runs on this thread: ops it calls inside
    (``recv`` is ``irecv`` + ``wait`` in torch 2.13) are not recorded twice."""

    depth = 0


_inside = _Inside()


def _nbytes_dtype(obj: Any) -> tuple[int, int]:
    """Bytes and dtype code of a tensor or a list of tensors (0, 0: none)."""
    if obj is None:
        return 0, 0
    if isinstance(obj, list | tuple):
        total, code = 0, 0
        for t in obj:
            n, c = _nbytes_dtype(t)
            total, code = total + n, code or c
        return total, code
    try:
        nbytes = int(obj.numel()) * int(obj.element_size())
        name = str(obj.dtype).removeprefix("torch.")
    except AttributeError:
        return 0, 0
    return nbytes, _DTYPE_CODE.get(name, DTYPE_OTHER)


class _Args:
    """Positional index of the parameters a wrapper reads, from the signature."""

    def __init__(self, fn: Callable[..., Any], *names: str) -> None:
        params = list(inspect.signature(fn).parameters)
        self.index = {n: params.index(n) for n in names if n in params}

    def get(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        i = self.index.get(name)
        if i is not None and i < len(args):
            return args[i]
        return kwargs.get(name)


class TracedWork:
    """The backend's work handle; records completion at ``wait()`` (no futures)."""

    def __init__(  # noqa: PLR0917 - private plumbing of one module
        self, work: Any, tracer: Tracer, comm: int, seq: int, issue_ns: int
    ) -> None:
        self._work, self._tracer = work, tracer
        self._op = (comm, seq, issue_ns)
        self._recorded = False

    def _record(self) -> None:
        if not self._recorded:
            self._recorded = True
            comm, seq, issue = self._op
            self._tracer.done(time.time_ns(), comm, seq, issue)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        """Wait like the backend's work, then record the completion."""
        out = self._work.wait(*args, **kwargs)
        self._record()
        return out

    def is_completed(self) -> bool:
        """The backend's answer; a True records the completion."""
        done = bool(self._work.is_completed())
        if done:
            self._record()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class Patcher:
    """Installs and removes the wrappers on ``torch.distributed``."""

    def __init__(
        self,
        tracer: Tracer,
        dist: Any,
        fr: FrConfig | None = None,
        *,
        gpu_done: bool = True,
    ) -> None:
        self.tracer, self.dist = tracer, dist
        self.c10d = dist.distributed_c10d
        self.fr = fr if fr is not None and fr.capacity > 0 else None
        self.poller: FrPoller | None = None
        self.gpu: GpuCompletions | None = None
        self._gpu_wanted = gpu_done
        self.originals: dict[str, Any] = {}
        self._groups: dict[int, tuple[Any, CommRef]] = {}
        self._by_name: dict[str, CommRef] = {}
        self._p2p: dict[tuple[int, int, int], CommRef] = {}

    # -- groups --------------------------------------------------------------
    def ensure_open(self) -> bool:
        """Open the ring once the default group exists; False before that."""
        if self.tracer.ring is not None:
            return True
        if not self.dist.is_initialized():
            return False
        self.tracer.open(int(self.dist.get_rank()), _local_rank())
        if self.fr is not None:
            self._start_poller(self.fr)
        self.group_ref(None)
        return True

    def _start_poller(self, fr: FrConfig) -> None:
        default = self.c10d._get_default_group()
        nccl = "nccl" in str(self.dist.get_backend(default)).lower()
        c_c10d = importlib.import_module("torch._C._distributed_c10d")
        dumps = recorder_dumps(c_c10d, nccl)
        if not dumps:
            return
        poller = FrPoller(
            self.tracer, dumps, self.ref_by_name, fr.capacity, fr.full_period_s
        )
        self.poller = poller
        poller.start()
        self.tracer.dropped_ops = lambda: poller.stats.lost
        if not (nccl and self._gpu_wanted):
            self.tracer.on_tick = poller.poll
            return
        gpu = self.gpu = GpuCompletions(self.tracer)
        self.tracer.dropped_ops = lambda: poller.stats.lost + gpu.stats.lost

        def tick() -> None:
            poller.poll()  # OP_ISSUED of the C++-issued ops first
            gpu.drain()

        self.tracer.on_tick = tick

    def ref_by_name(self, name: str) -> CommRef | None:
        """The communicator of the group torch names ``name`` (None: unknown)."""
        hit = self._by_name.get(name)
        if hit is not None:
            return hit
        for pg, pg_name in list(self.c10d._world.pg_names.items()):
            if str(pg_name) == name:
                return self.group_ref(pg)
        return None

    def group_ref(self, group: Any) -> CommRef | None:
        """The communicator of ``group`` (None: default); None if not a member."""
        key = id(group)
        hit = self._groups.get(key)
        if hit is not None and hit[0] is group:
            return hit[1]
        pg = group if group is not None else self.c10d._get_default_group()
        if pg is None or pg is self.c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        name = str(getattr(pg, "group_name", "") or "0")
        ref = self._by_name.get(name)
        if ref is not None:
            self._groups[key] = (group, ref)
            return ref
        ranks = tuple(int(r) for r in self.dist.get_process_group_ranks(pg))
        desc = str(getattr(pg, "group_desc", "") or "")
        default = pg is self.c10d._get_default_group()
        role = "world" if default else (desc if desc not in ("", "undefined") else "")
        ref = CommRef(comm_hash(name), ranks, role or f"pg{name}", pg=pg)
        if self.poller is not None:
            ref.backend_seq = pg._get_sequence_number_for_group
            backend = str(self.dist.get_backend(pg)).lower()
            ref.counts_p2p = backend == "gloo"
            if self.gpu is not None and "nccl" in backend:
                register(pg, ref, self.gpu)
        self._groups[key] = (group, ref)
        self._by_name[name] = ref
        me = int(self.dist.get_rank())
        if me in ranks:
            self.tracer.register(ref, ranks.index(me))
        return ref

    def p2p_ref(self, group: Any, src: int, dst: int) -> CommRef | None:
        """The virtual communicator of ``src -> dst`` (global ranks) in ``group``."""
        base = self.group_ref(group)
        if base is None:
            return None
        key = (base.comm, src, dst)
        ref = self._p2p.get(key)
        if ref is None:
            gname = f"{base.comm:x}"
            ref = self._p2p[key] = CommRef(
                p2p_hash(gname, src, dst), (src, dst), f"p2p{src}-{dst}"
            )
            me = int(self.dist.get_rank())
            self.tracer.register(ref, 0 if me == src else 1)
        return ref

    # -- wrappers ------------------------------------------------------------
    def _collective(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        op_name, input_param = COLLECTIVES[name]
        kind = OP_NAMES.index(op_name)
        argi = _Args(fn, "group", "async_op", input_param)
        tracer = self.tracer

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if _inside.depth or not self.ensure_open():
                return fn(*args, **kwargs)
            _inside.depth = 1
            try:
                return record(*args, **kwargs)
            finally:
                _inside.depth = 0

        def record(*args: Any, **kwargs: Any) -> Any:
            ref = self.group_ref(argi.get("group", args, kwargs))
            if ref is None:
                return fn(*args, **kwargs)
            nbytes, dtype = _nbytes_dtype(argi.get(input_param, args, kwargs))
            if ref.backend_seq is None:
                seq = ref.seq
            else:
                seq = ref.next_seq()
                ref.wrapped[seq] = nbytes  # before the backend: the poller skips it
            ref.seq += 1
            t0 = time.time_ns()
            tracer.issued(t0, ref.comm, seq, nbytes, kind, dtype)
            work = fn(*args, **kwargs)
            if ref.gpu_done:  # the GPU's completion comes through the hook
                return work
            if argi.get("async_op", args, kwargs) and work is not None:
                return TracedWork(work, tracer, ref.comm, seq, t0)
            tracer.done(time.time_ns(), ref.comm, seq, t0)
            return work

        return traced

    def _point_to_point(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        op_name, peer_param, returns_work = P2P[name]
        kind = OP_NAMES.index(op_name)
        argi = _Args(fn, "group", peer_param, "tensor")
        tracer, sending = self.tracer, op_name == "send"

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if _inside.depth or not self.ensure_open():
                return fn(*args, **kwargs)
            _inside.depth = 1
            try:
                return record(*args, **kwargs)
            finally:
                _inside.depth = 0

        def record(*args: Any, **kwargs: Any) -> Any:
            base = self.group_ref(argi.get("group", args, kwargs))
            if base is not None and base.counts_p2p:
                base.p2p_calls += 1  # gloo numbers p2p ops with collectives
            peer = argi.get(peer_param, args, kwargs)
            if peer is None:
                return fn(*args, **kwargs)
            me = tracer.rank
            src, dst = (me, int(peer)) if sending else (int(peer), me)
            ref = self.p2p_ref(argi.get("group", args, kwargs), src, dst)
            if ref is None:
                return fn(*args, **kwargs)
            seq = ref.seq
            ref.seq = seq + 1
            nbytes, dtype = _nbytes_dtype(argi.get("tensor", args, kwargs))
            t0 = time.time_ns()
            tracer.issued(t0, ref.comm, seq, nbytes, kind, dtype)
            out = fn(*args, **kwargs)
            if returns_work and out is not None:
                return TracedWork(out, tracer, ref.comm, seq, t0)
            tracer.done(time.time_ns(), ref.comm, seq, t0)
            return out

        return traced

    def _after_group_made(
        self, name: str, fn: Callable[..., Any]
    ) -> Callable[..., Any]:
        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            if self.ensure_open() and name == "new_group":
                self.group_ref(out)
            return out

        return traced

    def _before_destroy(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if self.poller is not None:  # the last ops, while the groups exist
                self.poller.flush()
            if self.gpu is not None:
                self.gpu.drain()
            return fn(*args, **kwargs)

        return traced

    def install(self) -> None:
        """Replace the ops on ``torch.distributed`` and ``distributed_c10d``."""
        if self.originals:
            return
        wrap: list[tuple[str, Callable[..., Any]]] = []
        for name in COLLECTIVES:
            if hasattr(self.c10d, name):
                wrap.append((name, self._collective(name, getattr(self.c10d, name))))
        for name in P2P:
            if hasattr(self.c10d, name):
                fn = getattr(self.c10d, name)
                wrap.append((name, self._point_to_point(name, fn)))
        for name in ("init_process_group", "new_group"):
            fn = getattr(self.c10d, name)
            wrap.append((name, self._after_group_made(name, fn)))
        destroy = getattr(self.c10d, "destroy_process_group", None)
        if destroy is not None:
            wrap.append(("destroy_process_group", self._before_destroy(destroy)))
        for name, traced in wrap:
            self.originals[name] = getattr(self.c10d, name)
            setattr(self.c10d, name, traced)
            if getattr(self.dist, name, None) is self.originals[name]:
                setattr(self.dist, name, traced)
        self.ensure_open()

    def uninstall(self) -> None:
        """Put the original ops back."""
        for name, fn in self.originals.items():
            if getattr(self.dist, name, None) is getattr(self.c10d, name):
                setattr(self.dist, name, fn)
            setattr(self.c10d, name, fn)
        self.originals.clear()


def _local_rank() -> int:
    import os  # noqa: PLC0415 - keeps the module's import surface small

    try:
        return int(os.environ.get("LOCAL_RANK", "-1"))
    except ValueError:
        return -1
