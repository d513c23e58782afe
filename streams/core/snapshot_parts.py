"""An engine's snapshot as one part per state holder, each with its version.

:data:`PARTS` is the table: a part's name, its version, and where its holder
sits in an :class:`~mycroft.streams.core.engine.Analyzer`. Bump a part's
version whenever what its holder keeps changes (an attribute added, renamed
or retyped in any class it holds): a snapshot whose part has another
version rebuilds that holder empty, logged, and restores every other part.
Adding a state holder is one row of the table.

The detector config is a part too: a restored engine takes on the worker's
current config, except where the config sizes state the snapshot holds
(:data:`SIZING`): such a snapshot keeps its own detector thresholds (its
rings stay consistent with them) and takes the current root-cause scoring.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.snapshot_codec import Part, PartError, Sealed
from mycroft.streams.core.state_tree import class_of, decode_tree, encode_tree

if TYPE_CHECKING:
    from mycroft.streams.core.engine import Analyzer

log = logging.getLogger(__name__)

SIZING = (
    "baseline_window",
    "slow_of",
    "late_of",
    "recur_of",
    "hold_of",
    "transfer_rows_per_rank",
    "transfer_rows_min",
)
"""Detector keys that size state an engine keeps (its rings and windows)."""


@dataclass(frozen=True)
class PartSpec:
    """One row of :data:`PARTS`: a holder at ``path`` (dotted, from the
    engine), or, with ``attrs``, those attributes of the object there."""

    name: str
    version: int
    path: str
    attrs: tuple[str, ...] = ()

    def get(self, engine: Analyzer) -> Any:
        """The holder (or a dict of its ``attrs``) in ``engine``."""
        obj = _walk(engine, self.path)
        return {a: getattr(obj, a) for a in self.attrs} if self.attrs else obj

    def put(self, engine: Analyzer, value: Any) -> None:
        """Install a restored holder (or its ``attrs``) in ``engine``."""
        if self.attrs:
            obj = _walk(engine, self.path)
            for a in self.attrs:
                object.__setattr__(obj, a, value[a])
            return
        parent, _, name = self.path.rpartition(".")
        object.__setattr__(_walk(engine, parent), name, value)


def _walk(obj: Any, path: str) -> Any:
    for name in filter(None, path.split(".")):
        obj = getattr(obj, name)
    return obj


PARTS: tuple[PartSpec, ...] = (
    # A holder is restored after the holders that refer to it (their
    # reference resolves to the engine's, replaced next).
    PartSpec("progress", 1, "ctx.store"),
    PartSpec("transfers", 1, "ctx.store.transfers"),
    PartSpec("topology", 1, "ctx.topo"),
    PartSpec("baselines", 1, "ctx.book"),
    PartSpec("gate", 1, "gate"),
    PartSpec("dedup", 1, "dedup"),
    PartSpec("recent", 1, "", ("stats", "tracker", "_unobserved")),
    PartSpec("incidents", 1, "incidents"),
    PartSpec("rhythm", 1, "rhythm"),
    PartSpec("pending", 1, "", ("_pending", "duplicates")),
)
"""The engine's state holders, in restore order."""

CONFIG = PartSpec("config", 1, "cfg")
"""The detector config the engine ran with (see :func:`resolve_config`)."""


def _refs(engine: Analyzer) -> dict[str, object]:
    """Objects more than one holder refers to, by name."""
    out: dict[str, object] = {"cfg": engine.cfg, "rca": engine.cfg.rca}
    out |= {p.name: p.get(engine) for p in PARTS if not p.attrs}
    return out


def snapshot_engine(engine: Analyzer) -> list[Part]:
    """The engine's parts: its config, then one per :data:`PARTS` row."""
    by_id = {id(v): k for k, v in _refs(engine).items()}
    out = [Part(CONFIG.name, CONFIG.version, encode_tree(engine.cfg, {}))]
    for spec in PARTS:
        out.append(Part(spec.name, spec.version, encode_tree(spec.get(engine), by_id)))
    return out


@dataclass
class Restored:
    """An engine rebuilt from its parts, and what of it was not restored."""

    engine: Any  # an Analyzer, or the engine :func:`restore_any` restored
    kept: set[str] = field(default_factory=set)  # detector keys of the snapshot's
    lost: dict[str, str] = field(default_factory=dict)  # part -> why rebuilt empty


def restore_engine(
    job_id: str,
    parts: list[Sealed],
    current: DetectorConfig | None,
    kind: type[Analyzer] | None = None,
) -> Restored:
    """Rebuild a job's engine from its parts; each part that has another
    version or fails to decode is rebuilt empty alone (listed in ``lost``)."""
    by_name = {p.name: p for p in parts}
    lost: dict[str, str] = {}
    old = _open(CONFIG, by_name, {}, lost)
    cfg, kept = resolve_config(old, current)
    out = Restored((kind or _analyzer_class())(job_id, cfg), kept, lost)
    for spec in PARTS:
        value = _open(spec, by_name, _refs(out.engine), lost)
        if value is not None:
            spec.put(out.engine, value)
    for name, why in lost.items():
        log.warning("job %s: snapshot part %r rebuilt empty (%s)", job_id, name, why)
    return out


def _open(
    spec: PartSpec,
    by_name: dict[str, Sealed],
    refs: dict[str, object],
    lost: dict[str, str],
) -> Any:
    """The decoded holder of ``spec``'s part, or None (why in ``lost``)."""
    sealed = by_name.get(spec.name)
    if sealed is None:
        lost[spec.name] = "not in the snapshot"
    elif sealed.version != spec.version:
        lost[spec.name] = (
            f"part version {sealed.version}, this release reads {spec.version}"
        )
    else:
        try:
            return decode_tree(sealed.open().fields, refs)
        except PartError as exc:
            lost[spec.name] = f"does not decode: {exc}"
    return None


def resolve_config(
    old: DetectorConfig | None, now: DetectorConfig | None
) -> tuple[DetectorConfig, set[str]]:
    """The config a restored engine runs with, and the detector keys that
    kept the snapshot's values (a sizing key differs)."""
    if old is None or now is None:
        return (now or old or DetectorConfig()), set()
    if all(getattr(old, k) == getattr(now, k) for k in SIZING):
        return now, set()
    kept = {
        f.name
        for f in fields(DetectorConfig)
        if f.name != "rca" and getattr(old, f.name) != getattr(now, f.name)
    }
    return replace(old, rca=now.rca), kept


SHELL = PartSpec("engine", 1, "")
"""What an engine keeps besides its analyzer's parts: all of a stage's own
engine (``JobResolver``), a wrapper's own attributes (``CommAnalyzer``)."""
_ANALYZER_ATTRS = frozenset(
    {
        "cfg",
        "ctx",
        *(p.path.split(".")[0] for p in PARTS),
        *(a for p in PARTS for a in p.attrs),
    }
    - {""}
)


def _analyzer_class() -> type[Analyzer]:
    """The analyzer class (imported on use: it pulls in scipy and networkx)."""
    from mycroft.streams.core.engine import Analyzer  # noqa: PLC0415

    return Analyzer


def _analyzer(engine: object) -> Analyzer | None:
    """The analyzer an engine is or wraps (``inner``), if any."""
    kind = _analyzer_class()
    inner = engine if isinstance(engine, kind) else getattr(engine, "inner", None)
    return inner if isinstance(inner, kind) else None


def analyzer_of(kind: str, job_id: str, config: DetectorConfig | None) -> Analyzer:
    """A new analyzer of class ``kind`` (``module:qualname``).

    Raises:
        PartError: ``kind`` is another engine: restore it with the worker's
            engine factory.
    """
    cls = class_of(kind)
    if not issubclass(cls, _analyzer_class()):
        raise PartError(f"a {kind} engine restores with the worker's engine factory")
    return cls(job_id, config)


def snapshot_any(engine: object) -> list[Part]:
    """The parts of any engine: its analyzer's parts (if it is or wraps one)
    and its other attributes as the ``engine`` part."""
    core = _analyzer(engine)
    parts = snapshot_engine(core) if core is not None else []
    cfg = getattr(engine, "cfg", None)
    refs = {id(core): "analyzer", id(cfg): "cfg"}
    own = {
        k: v
        for k, v in vars(engine).items()
        if engine is not core or k not in _ANALYZER_ATTRS
    }
    parts.append(Part(SHELL.name, SHELL.version, encode_tree(own, refs)))
    return parts


def restore_any(
    job_id: str, fresh: object, parts: list[Sealed], current: DetectorConfig | None
) -> Restored:
    """Restore into ``fresh``, a new engine of the snapshot's kind (its
    analyzer rebuilt from its parts, its other attributes from ``engine``)."""
    core = _analyzer(fresh)
    out = Restored(fresh)
    refs: dict[str, object] = {"cfg": getattr(fresh, "cfg", None)}
    if core is not None:
        out = restore_engine(job_id, parts, current, type(core))
        refs = {"analyzer": out.engine, "cfg": out.engine.cfg}
        if fresh is core:
            fresh = out.engine
    own = _open(SHELL, {p.name: p for p in parts}, refs, out.lost)
    for k, v in (own or {}).items():
        object.__setattr__(fresh, k, v)
    if own is None:
        log.warning(
            "job %s: snapshot part 'engine' rebuilt empty (%s)",
            job_id,
            out.lost["engine"],
        )
    out.engine = fresh
    return out
