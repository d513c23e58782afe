"""The .avsc files: documented field by field, and in step with columns.py."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from typing import Any

import pytest

from mycroft.schemas.codec import (
    SCHEMA_FILES,
    Codec,
    SchemaStore,
    fingerprint_of,
    load_schema_json,
)
from mycroft.schemas.columns import COMPLETION_GROUPS, STATE_GROUPS
from mycroft.schemas.records import RootCause
from mycroft.schemas.vocab import Component, FaultKind
from tests.unit.samples import all_records


def _fields(schema: Any) -> list[dict[str, Any]]:
    """Every field of every record reachable from ``schema``."""
    out: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "record":
            for f in schema["fields"]:
                out.append(f)
                out += _fields(f["type"])
        elif schema.get("type") == "array":
            out += _fields(schema["items"])
    elif isinstance(schema, list):
        for branch in schema:
            out += _fields(branch)
    return out


@pytest.mark.parametrize("filename", sorted(SCHEMA_FILES.values()))
def test_every_field_is_documented(filename: str) -> None:
    schema = load_schema_json(filename)
    assert schema.get("doc")
    undocumented = [f["name"] for f in _fields(schema) if not f.get("doc")]
    assert undocumented == []


@pytest.mark.parametrize(
    ("filename", "groups"),
    [("state.avsc", STATE_GROUPS), ("completion.avsc", COMPLETION_GROUPS)],
)
def test_columnar_schemas_match_the_column_tables(filename: str, groups: Any) -> None:
    fields = {f["name"]: f for f in load_schema_json(filename)["fields"]}
    expected = {f"{g}_{c.name}" for g, cols in groups.items() for c in cols}
    expected |= {f"n_{g}" for g in groups}
    columnar = {n for n in fields if n.split("_")[0] in groups or n.startswith("n_")}
    assert columnar == expected
    for g, cols in groups.items():
        for c in cols:
            f = fields[f"{g}_{c.name}"]
            assert f["type"] == "bytes"
            assert c.doc in f["doc"]
            # A column added later has the empty default older writers lack.
            assert f.get("default") == ("" if c.optional else None)


def _enum_symbols(name: str) -> list[str]:
    for filename in SCHEMA_FILES.values():
        for f in _fields(load_schema_json(filename)):
            t = f["type"]
            if isinstance(t, dict) and t.get("type") == "enum" and t["name"] == name:
                return list(t["symbols"])
    raise AssertionError(f"enum {name} not found")


def test_component_and_fault_kind_vocabularies_are_the_fixed_ones() -> None:
    assert _enum_symbols("Component") == [c.value for c in Component]
    assert _enum_symbols("Component") == [
        "gpu",
        "nic",
        "network",
        "pcie",
        "proxy",
        "process",
        "host",
        "config",
    ]
    assert _enum_symbols("FaultKind") == [k.value for k in FaultKind]
    assert _enum_symbols("FaultKind") == ["hang", "slowdown", "mismatch"]


def test_every_current_schema_is_recorded_in_history() -> None:
    """A schema change must be released into history/ (evolution rule 4)."""
    store = SchemaStore()
    history = resources.files("mycroft.schemas").joinpath("history")
    recorded = {
        fingerprint_of(json.loads(e.read_text("utf-8")))
        for e in history.iterdir()
        if e.name.endswith(".avsc")
    }
    for name in SCHEMA_FILES:
        assert store.current(name).fingerprint in recorded, name


def test_a_root_cause_from_before_rules_reads_with_none() -> None:
    """RootCause.2 writers (no ``rules``) still decode: the default fills in."""
    older = SchemaStore()
    history = resources.files("mycroft.schemas").joinpath("history")
    schema = json.loads(history.joinpath("RootCause.2.avsc").read_text("utf-8"))
    older._current["RootCause"] = older.register(schema)
    rc = next(r for r in all_records() if isinstance(r, RootCause))
    assert any(c.rules for c in rc.culprits)
    _, datum = Codec().decode_datum(Codec().encode(rc))
    for c in datum["culprits"]:
        del c["rules"]
    back = Codec().decode(Codec(older).encode_datum("RootCause", datum))
    assert isinstance(back, RootCause)
    assert back.culprits == tuple(replace(c, rules=()) for c in rc.culprits)
