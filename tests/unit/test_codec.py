"""Wire codec: round trips, fingerprints, bad input, schema evolution."""

from __future__ import annotations

import copy
import dataclasses
import struct

import numpy as np
import pytest
from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from mycroft.errors import DecodeError
from mycroft.schemas.codec import (
    MAGIC,
    Codec,
    SchemaStore,
    fingerprint_of,
    load_schema_json,
)
from mycroft.schemas.fingerprint import crc64_avro
from tests.unit.samples import all_records, state_batch


@pytest.mark.parametrize("filename", ["state.avsc", "rootcause.avsc", "topology.avsc"])
def test_crc64_avro_agrees_with_fastavro(filename: str) -> None:
    canonical = to_parsing_canonical_form(parse_schema(load_schema_json(filename)))
    ours = crc64_avro(canonical.encode()).to_bytes(8, "little").hex()
    assert ours == fingerprint(canonical, "CRC-64-AVRO")


def test_crc64_avro_of_null_is_the_specification_value() -> None:
    assert crc64_avro(b'"null"') == 0x63DD24E7CC258F8A


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_every_record_type_round_trips(record: object) -> None:
    codec = Codec()
    wire = codec.encode(record)  # type: ignore[arg-type]
    assert wire[:2] == MAGIC
    back = codec.decode(wire)
    assert type(back) is type(record)
    assert _normalized(back) == _normalized(record)


def _normalized(record: object) -> object:
    """Dataclass state with numpy arrays made comparable."""
    return {
        k: v.tolist() if isinstance(v, np.ndarray) else v
        for k, v in vars(record).items()
    }


def test_fingerprint_header_names_the_writer_schema() -> None:
    codec = Codec()
    wire = codec.encode(state_batch())
    (fp,) = struct.unpack_from("<Q", wire, 2)
    assert fp == codec.store.current("StateBatch").fingerprint
    assert fp == fingerprint_of(load_schema_json("state.avsc"))


def test_columns_keep_unsigned_comm_hashes_and_values() -> None:
    batch = state_batch()
    back = Codec().decode(Codec().encode(batch))
    assert back.rc["comm"].dtype == np.uint64  # type: ignore[union-attr]
    assert back.rc["comm"][0] == batch.rc["comm"][0]  # type: ignore[union-attr]
    assert np.array_equal(back.flow["done"], batch.flow["done"])  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (b"hello, not avro", "not-avro"),
        (b"", "not-avro"),
        (MAGIC + b"\x00" * 8 + b"\x02", "unknown-fingerprint"),
    ],
)
def test_bad_input_raises_decode_error_with_reason(wire: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        Codec().decode(wire)
    assert info.value.reason == reason


def test_truncated_record_is_reported_as_truncated() -> None:
    wire = Codec().encode(state_batch())
    with pytest.raises(DecodeError) as info:
        Codec().decode(wire[: len(wire) // 2])
    assert info.value.reason == "truncated"


def test_trailing_bytes_are_invalid() -> None:
    wire = Codec().encode(state_batch())
    with pytest.raises(DecodeError) as info:
        Codec().decode(wire + b"\x00\x00")
    assert info.value.reason == "invalid"


def test_column_of_wrong_length_is_invalid() -> None:
    codec = Codec()
    _, datum = codec.decode_datum(codec.encode(state_batch()))
    datum["flow_done"] = datum["flow_done"][:-1]
    with pytest.raises(DecodeError) as info:
        codec.decode(codec.encode_datum("StateBatch", datum))
    assert info.value.reason == "invalid"
    assert "flow_done" in info.value.detail


def test_located_error_names_topic_partition_offset() -> None:
    err = DecodeError("truncated", "x").located("mycroft.raw.state.v1", 3, 42)
    assert "mycroft.raw.state.v1[3]@42" in str(err)
    assert (err.topic, err.partition, err.offset) == ("mycroft.raw.state.v1", 3, 42)


def _newer_schema(name: str, filename: str) -> dict[str, object]:
    """The current schema plus a field with a default: a compatible v1 change."""
    schema = copy.deepcopy(load_schema_json(filename))
    schema["fields"].append(  # type: ignore[union-attr]
        {"name": "numa_node", "type": "int", "default": -1, "doc": "added later"}
    )
    return schema


def test_old_reader_reads_a_record_from_a_newer_writer() -> None:
    newer = SchemaStore()
    version = newer.register(_newer_schema("Heartbeat", "heartbeat.avsc"))
    newer._current["Heartbeat"] = version  # the newer producer writes with it
    hb = next(r for r in all_records() if type(r).__name__ == "Heartbeat")
    _, datum = Codec().decode_datum(Codec().encode(hb))
    wire = Codec(newer).encode_datum("Heartbeat", datum | {"numa_node": 1})

    old = Codec()  # knows only the current schema ...
    with pytest.raises(DecodeError) as info:
        old.decode(wire)
    assert info.value.reason == "unknown-fingerprint"
    old.store.register(_newer_schema("Heartbeat", "heartbeat.avsc"))  # ... until told
    assert old.decode(wire) == hb


def test_new_reader_reads_a_record_from_an_older_writer() -> None:
    newer = SchemaStore()
    newer._current["Heartbeat"] = newer.register(
        _newer_schema("Heartbeat", "heartbeat.avsc")
    )
    hb = next(r for r in all_records() if type(r).__name__ == "Heartbeat")
    _, datum = Codec(newer).decode_datum(Codec().encode(hb))
    assert datum["numa_node"] == -1


def test_a_completion_batch_from_before_wire_times_decodes_with_none_measured() -> None:
    older = SchemaStore()
    older._current["CompletionBatch"] = older.register(
        load_schema_json("history/CompletionBatch.1.avsc")
    )
    batch = next(r for r in all_records() if type(r).__name__ == "CompletionBatch")
    assert len(batch.flow)
    _, datum = Codec().decode_datum(Codec().encode(batch))
    datum.pop("flow_wire_ns")
    wire = Codec(older).encode_datum("CompletionBatch", datum)

    got = Codec().decode(wire)  # the current reader knows the older fingerprint
    assert (got.flow["wire_ns"] == 0).all()
    assert (got.flow["last_ns"] == batch.flow["last_ns"]).all()


def test_a_state_batch_from_before_ready_wait_decodes_with_none_measured() -> None:
    older = SchemaStore()
    older._current["StateBatch"] = older.register(
        load_schema_json("history/StateBatch.1.avsc")
    )
    batch = next(r for r in all_records() if type(r).__name__ == "StateBatch")
    assert len(batch.flow)
    _, datum = Codec().decode_datum(Codec().encode(batch))
    datum.pop("flow_ready_wait_us")
    old = Codec(older).encode_datum("StateBatch", datum)

    got = Codec().decode(old)  # the current reader knows the older fingerprint
    assert (got.flow["ready_wait_us"] == 0).all()
    assert (got.flow["gpu_ready"] == batch.flow["gpu_ready"]).all()


def test_a_state_batch_keeps_its_ready_wait() -> None:
    batch = next(r for r in all_records() if type(r).__name__ == "StateBatch")
    flow = batch.flow.copy()
    flow["ready_wait_us"] = np.arange(len(flow), dtype=np.int32) * 7
    sent = dataclasses.replace(batch, flow=flow)

    got = Codec().decode(Codec().encode(sent))
    assert (got.flow["ready_wait_us"] == flow["ready_wait_us"]).all()
