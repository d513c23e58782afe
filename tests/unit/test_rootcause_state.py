"""RootCause.4: an incident's state on the wire, and records from before it."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources

from mycroft.schemas.codec import Codec, SchemaStore
from mycroft.schemas.records import RootCause
from mycroft.schemas.vocab import IncidentState
from tests.unit.samples import all_records


def _sample() -> RootCause:
    return next(r for r in all_records() if isinstance(r, RootCause))


def _older(version: int) -> SchemaStore:
    """A store that writes RootCause with history/RootCause.<version>.avsc."""
    store = SchemaStore()
    history = resources.files("mycroft.schemas").joinpath("history")
    text = history.joinpath(f"RootCause.{version}.avsc").read_text("utf-8")
    store._current["RootCause"] = store.register(json.loads(text))
    return store


def test_a_closed_revision_round_trips() -> None:
    closed = replace(
        _sample(),
        revision=1,
        state=IncidentState.CLOSED,
        closed_ns=_sample().resolved_ns + 7_000_000_000,
        close_reason="quiet for 5.1 s of event time (incident_quiet_s 5)",
    )
    back = Codec().decode(Codec().encode(closed))
    assert back == closed and back.is_closed and back.states_closure


def test_a_root_cause_from_before_state_reads_as_open() -> None:
    """A RootCause.3 writer's record decodes as open, with no closure, and
    says its writer never announces one (readers keep their TTL for it)."""
    rc = _sample()
    _, datum = Codec().decode_datum(Codec().encode(rc))
    for name in ("state", "closed_ns", "close_reason"):
        del datum[name]
    back = Codec().decode(Codec(_older(3)).encode_datum("RootCause", datum))
    assert isinstance(back, RootCause)
    assert back.state is IncidentState.OPEN and not back.is_closed
    assert (back.closed_ns, back.close_reason) == (None, None)
    assert not back.states_closure
    assert replace(back, states_closure=True) == rc


def test_an_older_reader_given_the_new_schema_reads_a_closed_record() -> None:
    """Evolution rule 4: a RootCause.3 reader that registers RootCause.4
    resolves a closed revision to the fields it knows."""
    closed = replace(_sample(), revision=1, state=IncidentState.CLOSED, closed_ns=1)
    reader = _older(3)
    reader.register(Codec().store.current("RootCause").parsed)
    name, datum = Codec(reader).decode_datum(Codec().encode(closed))
    assert name == "RootCause" and "state" not in datum
    assert datum["revision"] == 1
