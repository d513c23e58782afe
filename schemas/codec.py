"""The wire codec: Avro single-object encoding with schema fingerprints.

Every Kafka value Mycroft writes is::

    C3 01 | CRC-64-AVRO fingerprint of the writer schema (8 bytes, little-endian)
          | Avro binary body

(the Avro specification's "single object encoding"). A reader looks the
fingerprint up in its :class:`SchemaStore`, which knows the current schema of
every record type and every earlier published version (``schemas/history/``),
and resolves writer to reader schema with the Avro rules. See
``schemas/README.md`` for the evolution rules this relies on.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

from mycroft.errors import DecodeError, EncodeError, SchemaError
from mycroft.schemas.convert import from_datum, to_datum
from mycroft.schemas.fingerprint import crc64_avro
from mycroft.schemas.records import Record, RootCause

MAGIC = b"\xc3\x01"
HEADER_LEN = 10

SCHEMA_FILES: dict[str, str] = {
    "StateBatch": "state.avsc",
    "CompletionBatch": "completion.avsc",
    "Heartbeat": "heartbeat.avsc",
    "Topology": "topology.avsc",
    "Anomaly": "anomaly.avsc",
    "RootCause": "rootcause.avsc",
    "CommSummary": "commsummary.avsc",
}
"""Record type name -> schema file in this package."""


@dataclass(frozen=True)
class SchemaVersion:
    """One parsed schema and its fingerprint."""

    name: str
    fingerprint: int
    parsed: Any


def load_schema_json(filename: str) -> dict[str, Any]:
    """Read one ``.avsc`` file shipped with the package."""
    text = resources.files("mycroft.schemas").joinpath(filename).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def fingerprint_of(schema: dict[str, Any]) -> int:
    """CRC-64-AVRO of the schema's parsing canonical form."""
    canonical = to_parsing_canonical_form(fastavro.parse_schema(schema))
    return crc64_avro(canonical.encode("utf-8"))


def _short_name(full: str) -> str:
    return full.rsplit(".", 1)[-1]


class SchemaStore:
    """Current reader schemas plus every known writer schema, by fingerprint."""

    def __init__(self) -> None:
        self._current: dict[str, SchemaVersion] = {}
        self._by_fp: dict[int, SchemaVersion] = {}
        for name, filename in SCHEMA_FILES.items():
            self._current[name] = self.register(load_schema_json(filename))
        history = resources.files("mycroft.schemas").joinpath("history")
        if history.is_dir():
            for entry in sorted(history.iterdir(), key=lambda e: e.name):
                if entry.name.endswith(".avsc"):
                    self.register(json.loads(entry.read_text("utf-8")))

    def register(self, schema: dict[str, Any]) -> SchemaVersion:
        """Add a writer schema (e.g. a newer version seen in the wild)."""
        try:
            parsed: Any = fastavro.parse_schema(schema)
        except Exception as exc:
            raise SchemaError(f"invalid Avro schema: {exc}") from exc
        version = SchemaVersion(
            _short_name(parsed["name"]), fingerprint_of(schema), parsed
        )
        self._by_fp.setdefault(version.fingerprint, version)
        return version

    def current(self, name: str) -> SchemaVersion:
        """The schema this code writes and reads for record type ``name``."""
        try:
            return self._current[name]
        except KeyError:
            raise SchemaError(f"no schema for record type {name!r}") from None

    def writer(self, fingerprint: int) -> SchemaVersion | None:
        """The writer schema of ``fingerprint``, or None when unknown."""
        return self._by_fp.get(fingerprint)


class Codec:
    """Encode records to and decode them from single-object Avro bytes."""

    def __init__(self, store: SchemaStore | None = None) -> None:
        self.store = store or SchemaStore()

    def encode(self, record: Record) -> bytes:
        """Return the wire bytes of ``record``.

        Raises:
            EncodeError: the record does not fit its schema.
        """
        name, datum = to_datum(record)
        return self.encode_datum(name, datum)

    def encode_datum(self, name: str, datum: dict[str, Any]) -> bytes:
        """Encode an Avro datum of record type ``name`` with the current schema."""
        version = self.store.current(name)
        buf = io.BytesIO()
        buf.write(MAGIC)
        buf.write(struct.pack("<Q", version.fingerprint))
        try:
            fastavro.schemaless_writer(buf, version.parsed, datum)
        except Exception as exc:
            raise EncodeError(f"{name} does not fit its schema: {exc}") from exc
        return buf.getvalue()

    def decode_datum(self, data: bytes | None) -> tuple[str, dict[str, Any]]:
        """Decode wire bytes to ``(record type name, datum)`` in the reader schema.

        Raises:
            DecodeError: with reason ``null-value`` (a Kafka tombstone: no
                value at all), ``not-avro``, ``unknown-fingerprint``,
                ``truncated`` or ``invalid``; call ``.located(...)`` to add
                where it came from.
        """
        if data is None:
            raise DecodeError(
                "null-value",
                "a record without a value (a tombstone); on the compacted "
                "topology topic it means the host of its key left the job",
            )
        if not isinstance(data, bytes | bytearray | memoryview):
            raise DecodeError("not-avro", f"a value of type {type(data).__name__}")
        if len(data) < HEADER_LEN or data[:2] != MAGIC:
            raise DecodeError(
                "not-avro",
                f"{len(data)} bytes without the C3 01 single-object header",
            )
        (fp,) = struct.unpack_from("<Q", data, 2)
        writer = self.store.writer(fp)
        if writer is None:
            raise DecodeError(
                "unknown-fingerprint",
                f"writer schema {fp:016x} is not known here; upgrade the consumer "
                "or register the producer's schema",
            )
        reader = self.store.current(writer.name)
        body = io.BytesIO(data)
        body.seek(HEADER_LEN)
        reader_schema = None if reader.fingerprint == fp else reader.parsed
        try:
            datum = fastavro.schemaless_reader(body, writer.parsed, reader_schema)
        except (EOFError, StopIteration, struct.error) as exc:
            raise DecodeError(
                "truncated", f"{writer.name} body ends early: {exc!r}"
            ) from exc
        except Exception as exc:
            raise DecodeError("invalid", f"{writer.name} body: {exc!r}") from exc
        if body.tell() != len(data):
            raise DecodeError(
                "invalid",
                f"{len(data) - body.tell()} trailing bytes after {writer.name}",
            )
        if not isinstance(datum, dict):
            raise DecodeError("invalid", f"{writer.name} body is not a record")
        return writer.name, datum

    def decode(self, data: bytes | None) -> Record:
        """Decode wire bytes to a record (see :meth:`decode_datum` for errors)."""
        name, datum = self.decode_datum(data)
        try:
            record = from_datum(name, datum)
        except DecodeError:
            raise
        except (KeyError, ValueError, TypeError) as exc:
            raise DecodeError("invalid", f"{name}: {exc!r}") from exc
        if isinstance(record, RootCause) and data is not None:
            if "state" not in self._writer_fields(data):
                # A RootCause.1-3 writer never sends a closing revision.
                return replace(record, states_closure=False)
        return record

    def _writer_fields(self, data: bytes | bytearray | memoryview) -> frozenset[str]:
        """Field names of the writer schema of wire bytes already decoded."""
        (fp,) = struct.unpack_from("<Q", data, 2)
        writer = self.store.writer(fp)
        fields = writer.parsed.get("fields", ()) if writer is not None else ()
        return frozenset(f["name"] for f in fields)
