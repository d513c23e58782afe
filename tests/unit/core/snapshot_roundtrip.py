"""Snapshot round trips for tests: one object as a part, an engine as its parts."""

from __future__ import annotations

from typing import Any

from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.snapshot_codec import Part, decode_snapshot, encode_snapshot
from mycroft.streams.core.snapshot_parts import restore_engine, snapshot_engine
from mycroft.streams.core.state_tree import decode_tree, encode_tree


def roundtrip(obj: Any) -> Any:
    """``obj`` encoded as one snapshot part and decoded back."""
    data = encode_snapshot([Part("part", 1, encode_tree(obj, {}))])
    (sealed,) = decode_snapshot(data)
    return decode_tree(sealed.open().fields, {})


def roundtrip_engine(engine: Analyzer) -> Analyzer:
    """``engine`` snapshotted as its parts and restored with its own config."""
    sealed = decode_snapshot(encode_snapshot(snapshot_engine(engine)))
    restored = restore_engine(engine.ctx.job_id, sealed, None, type(engine))
    assert not restored.lost, restored.lost
    back: Analyzer = restored.engine
    return back
