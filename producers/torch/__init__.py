"""Live tracing of ``torch.distributed`` jobs into the node agent's ring buffer.

Three ways in, none needing a code change beyond one line or one variable:

* ``import mycroft.producers.torch as mt; mt.install()`` anywhere before or
  after ``init_process_group``;
* ``python -m mycroft.producers.torch.run train.py ARGS`` (also as
  ``torchrun ... -m mycroft.producers.torch.run train.py``);
* ``MYCROFT_TORCH_TRACE=1`` with ``PYTHONPATH=$(python -m
  mycroft.producers.torch.run --hook-dir)``: that folder's ``sitecustomize``
  calls :func:`install_from_env`, which patches ``torch.distributed`` as soon
  as the program imports it (torch is never imported on its behalf).

Settings (read only by :func:`install_from_env`, never at import):
``MYCROFT_RING_DIR`` (default ``/dev/shm/mycroft``, what ``mycroft agent
--ring-dir`` reads), ``MYCROFT_TORCH_RING_SLOTS`` (65536),
``MYCROFT_TORCH_BEAT_S`` (0.1), ``MYCROFT_TORCH_KEEP_RING=1`` (leave the ring
file at a clean exit), ``MYCROFT_TORCH_FR=0`` (do not poll the Flight
Recorder), ``MYCROFT_TORCH_FR_POLL_S`` (0: read its entries on every beat
that has new ones). ``TORCH_FR_BUFFER_SIZE`` is set to 128 when unset and
no process group exists yet.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from mycroft.producers.torch.frlive import (
    DEFAULT_FR_ENTRIES,
    DEFAULT_FULL_PERIOD_S,
    FrConfig,
)
from mycroft.producers.torch.nccl_done import TIMING_ENV
from mycroft.producers.torch.tracer import DEFAULT_RING_DIR, Tracer

log = logging.getLogger(__name__)
ENV_FLAG = "MYCROFT_TORCH_TRACE"
FR_SIZE_ENV = "TORCH_FR_BUFFER_SIZE"
TORCH_FR_DEFAULT_ENTRIES = 2000
"""torch's Flight Recorder ring size when ``TORCH_FR_BUFFER_SIZE`` is unset,
from 2.13 on; measured 0 (nothing recorded) on 2.8 and 2.10."""
FR_DEFAULT_SINCE = (2, 13)
"""The first release measured with a recorder on by default (2.11 and 2.12
were not measured; they are taken as off)."""
_state: dict[str, Any] = {}


def install(  # noqa: PLR0913 - keyword settings, one per MYCROFT_* variable
    ring_dir: Path | str | None = None,
    nslots: int = 1 << 16,
    beat_s: float = 0.1,
    keep_ring: bool = False,
    *,
    flight_recorder: bool = True,
    fr_poll_s: float = DEFAULT_FULL_PERIOD_S,
    gpu_done: bool = True,
) -> Tracer:
    """Wrap the ``torch.distributed`` ops of this process; return the tracer.

    Idempotent: a second call returns the running tracer. The ring file is
    created at ``init_process_group`` (or now, if it already ran) in
    ``ring_dir`` (default ``/dev/shm/mycroft``). With ``flight_recorder``
    the Flight Recorder's live buffer is polled on every beat, so that ops
    issued from C++ (DDP) are recorded too (``frlive``); ``fr_poll_s`` is
    the shortest wait between two reads of its entries. With
    ``gpu_done`` (and the Flight Recorder) a NCCL group's collectives
    complete at the GPU's time (``nccl_done``): ``TORCH_NCCL_ENABLE_TIMING``
    is set to 1 when unset and no group exists yet.
    """
    running = _state.get("tracer")
    if isinstance(running, Tracer):
        return running
    from mycroft.producers.torch.patch import Patcher  # noqa: PLC0415 - torch

    fr = None
    loaded = sys.modules.get("torch.distributed")
    made = loaded is not None and bool(loaded.is_initialized())
    if flight_recorder:
        fr = FrConfig(fr_capacity(os.environ, made, _torch_fr_default()), fr_poll_s)
        if gpu_done and not made:
            os.environ.setdefault(TIMING_ENV, "1")
    dist = importlib.import_module("torch.distributed")
    tracer = Tracer(ring_dir or DEFAULT_RING_DIR, nslots, beat_s, not keep_ring)
    patcher = Patcher(tracer, dist, fr, gpu_done=gpu_done)
    patcher.install()
    _state.update(tracer=tracer, patcher=patcher)
    atexit.register(uninstall)
    return tracer


def pause() -> None:
    """Put the original ops back for a while; the ring and the beat stay.

    Ops called while paused are not recorded, nor polled from the Flight
    Recorder. Without the Flight Recorder their op numbers are not taken
    either, so all ranks of a group must pause at the same point; with it,
    numbers are torch's and the paused ops leave a gap.
    """
    patcher = _state.get("patcher")
    if patcher is not None:
        patcher.uninstall()
        if patcher.poller is not None:
            patcher.poller.pause()


def resume() -> None:
    """Wrap the ops again after :func:`pause` (no-op when not installed)."""
    patcher = _state.get("patcher")
    if patcher is not None:
        if patcher.poller is not None and patcher.poller.paused:
            patcher.poller.resume()
        patcher.install()


def uninstall() -> None:
    """Restore the original ops and close the ring (called at exit too)."""
    patcher = _state.pop("patcher", None)
    tracer = _state.pop("tracer", None)
    if patcher is not None:
        if patcher.poller is not None and not patcher.poller.paused:
            patcher.poller.flush()
        patcher.uninstall()
    if tracer is not None:
        tracer.close()


def fr_capacity(
    env: MutableMapping[str, str],
    recorder_made: bool,
    torch_default: int = TORCH_FR_DEFAULT_ENTRIES,
) -> int:
    """The Flight Recorder's ring size in entries; asks for ours if unset.

    ``TORCH_FR_BUFFER_SIZE`` (``TORCH_NCCL_TRACE_BUFFER_SIZE`` before 2.8)
    wins when set. Unset, it is set to :data:`DEFAULT_FR_ENTRIES` unless a
    process group exists already (torch reads it when the first group is
    made; then torch's own default, ``torch_default``, is in force: 0, no
    recorder, before 2.13).
    """
    for name in (FR_SIZE_ENV, "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        raw = env.get(name, "").strip()
        if raw:
            try:
                return max(0, int(raw))
            except ValueError:
                return 0  # torch would not parse it either
    if recorder_made:
        if not torch_default:
            log.warning(
                "mycroft: the Flight Recorder is off in this torch (%s unset when "
                "the first process group was made): collectives issued in C++ "
                "(DDP) are not traced; set MYCROFT_TORCH_TRACE=1 or call "
                "install() before init_process_group, or export %s",
                FR_SIZE_ENV,
                FR_SIZE_ENV,
            )
        return torch_default
    env[FR_SIZE_ENV] = str(DEFAULT_FR_ENTRIES)
    return DEFAULT_FR_ENTRIES


def _torch_fr_default() -> int:
    """torch's recorder size when its variable is unset, by the loaded
    torch's version (0 before :data:`FR_DEFAULT_SINCE`)."""
    version = str(getattr(sys.modules.get("torch"), "__version__", ""))
    parts = version.split("+", maxsplit=1)[0].split(".")[:2]
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return TORCH_FR_DEFAULT_ENTRIES
    return TORCH_FR_DEFAULT_ENTRIES if major_minor >= FR_DEFAULT_SINCE else 0


def settings_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``install`` keyword arguments from ``MYCROFT_*`` variables.

    Raises:
        ValueError: a variable does not parse; the message names it.
    """
    out: dict[str, Any] = {"ring_dir": env.get("MYCROFT_RING_DIR") or None}
    for key, name, typ in (
        ("nslots", "MYCROFT_TORCH_RING_SLOTS", int),
        ("beat_s", "MYCROFT_TORCH_BEAT_S", float),
        ("fr_poll_s", "MYCROFT_TORCH_FR_POLL_S", float),
    ):
        raw = env.get(name, "").strip()
        if raw:
            try:
                out[key] = typ(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a {typ.__name__}") from None
    out["keep_ring"] = env.get("MYCROFT_TORCH_KEEP_RING", "") not in ("", "0")
    if env.get("MYCROFT_TORCH_FR", "1").strip() == "0":
        out["flight_recorder"] = False
    if env.get("MYCROFT_TORCH_GPU_DONE", "1").strip() == "0":
        out["gpu_done"] = False
    return out


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Calls ``install`` right after ``torch.distributed`` finished importing."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_install(module: ModuleType) -> None:
            exec_module(module)
            _install_env()

        loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


def _install_env() -> None:
    try:
        install(**_state.pop("env_settings", {}))
    except Exception as exc:  # never break the training job
        log.warning("mycroft: torch tracing not installed: %s", exc)


def install_from_env(env: Mapping[str, str] | None = None) -> bool:
    """The opt-in hook: trace if ``MYCROFT_TORCH_TRACE=1``; return whether armed.

    Does not import torch: if ``torch.distributed`` is not imported yet, the
    wrappers go in right after the program imports it.
    """
    env = os.environ if env is None else env
    if env.get(ENV_FLAG, "") in ("", "0"):
        return False
    try:
        _state["env_settings"] = settings_from_env(env)
    except ValueError as exc:
        print(f"mycroft: torch tracing disabled: {exc}", file=sys.stderr)
        return False
    if "torch.distributed" in sys.modules:
        _install_env()
    elif not any(isinstance(f, _PostImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook())
    return True


__all__ = [
    "ENV_FLAG",
    "Tracer",
    "install",
    "install_from_env",
    "pause",
    "resume",
    "uninstall",
]
