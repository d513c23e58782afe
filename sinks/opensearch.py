"""Detection results as documents in OpenSearch or Elasticsearch.

Only the API both share is used, over plain HTTP: ``PUT _index_template``,
``POST _bulk`` (NDJSON) and ``POST <index>/_refresh``. No client library is
needed: elasticsearch-py refuses to talk to OpenSearch, and opensearch-py
would add a dependency for two requests.

Documents are idempotent: an anomaly's ``_id`` is its ``anomaly_id`` and a
root cause's ``_id`` is its ``incident_id``, indexed with external versioning
(``version = revision``, ``version_type = external_gte``). A revision replaces
the one before it, a re-delivered revision replaces itself, and an older
revision that arrives late is refused by the server (409) and ignored here.

The revision that closes an incident (RootCause.4 on) is the next revision,
so it replaces the open document: ``state`` reads ``closed`` with
``closed_ns`` and ``close_reason``, and a late open revision cannot undo it.
Documents of older writers have ``state`` ``open`` and never close.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from mycroft.errors import ConfigError, SinkError
from mycroft.schemas.records import Anomaly, RootCause
from mycroft.sinks.base import SinkRecord

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses (of a request or of one bulk item) worth retrying."""

_KEYWORD = {"type": "keyword"}
_LONG = {"type": "long"}
_CULPRIT = {
    "properties": {
        "rank": {"type": "integer"},
        "host": _KEYWORD,
        "component": _KEYWORD,
        "kind": _KEYWORD,
        "confidence": {"type": "float"},
        "peer": {"type": "integer"},
        "channel": {"type": "integer"},
        "reason": {"type": "text"},
        "scope": _KEYWORD,
        "device": _KEYWORD,
        "ranks": {"type": "integer"},
        "rules": _KEYWORD,
    }
}
_COMMON = {
    "@timestamp": {"type": "date", "format": "epoch_millis"},
    "job_id": _KEYWORD,
    "kind": _KEYWORD,
    "onset_ns": _LONG,
    "detected_ns": _LONG,
    "emitted_wall_ns": _LONG,
}
MAPPINGS: dict[str, dict[str, Any]] = {
    "anomalies": {
        "anomaly_id": _KEYWORD,
        "comms": _KEYWORD,  # communicator ids are uint64: beyond a long
        "ranks": {"type": "integer"},
        "detector": _KEYWORD,
        "summary": {"type": "text"},
        "score": {"type": "float"},
        "detection_latency_s": {"type": "float"},
    },
    "rootcauses": {
        "incident_id": _KEYWORD,
        "revision": {"type": "integer"},
        "culprits": _CULPRIT,
        "best": _CULPRIT,
        "evidence": {
            "properties": {
                "fact": {"type": "text"},
                "rank": {"type": "integer"},
                "comm": _KEYWORD,
                "op_seq": _LONG,
            }
        },
        "anomaly_ids": _KEYWORD,
        "resolved_ns": _LONG,
        "detection_latency_s": {"type": "float"},
        "rca_latency_s": {"type": "float"},
        "state": _KEYWORD,
        "closed_ns": _LONG,
        "close_reason": {"type": "text"},
    },
}
"""Explicit field mappings per index kind (plus :data:`_COMMON`)."""


class OpenSearchSink:
    """Bulk-index anomalies and root causes; buffers until :meth:`flush`.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:9200``; ``user:password@`` in it
            becomes HTTP basic auth.
        index_prefix: indices are ``<prefix>-anomalies`` and ``<prefix>-rootcauses``.
        refresh: ``refresh`` parameter of ``_bulk`` (``"wait_for"`` in tests);
            None leaves it to the server's refresh interval.
        timeout_s: timeout of each HTTP request, seconds.
        max_batch: :meth:`write` flushes by itself when this many are buffered.

    Raises:
        ConfigError: ``url`` is not http(s) or ``index_prefix`` is not a valid
            lowercase index name.
    """

    def __init__(
        self,
        url: str,
        index_prefix: str = "mycroft",
        *,
        refresh: str | None = None,
        timeout_s: float = 10.0,
        max_batch: int = 500,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ConfigError(
                f"OpenSearch URL must be http(s)://host[:port], not {url!r}"
            )
        if (
            not index_prefix
            or index_prefix != index_prefix.lower()
            or "*" in index_prefix
        ):
            raise ConfigError(f"index prefix must be lowercase, not {index_prefix!r}")
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        self.base_url = urllib.parse.urlunsplit(
            (parts.scheme, netloc, parts.path.rstrip("/"), "", "")
        )
        self._headers = {"Accept": "application/json"}
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            token = f"{user}:{urllib.parse.unquote(parts.password or '')}"
            self._headers["Authorization"] = (
                "Basic " + base64.b64encode(token.encode()).decode()
            )
        self.index_prefix = index_prefix
        self._refresh = refresh
        self._timeout_s = timeout_s
        self._max_batch = max_batch
        self._buffer: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}
        self._templates_ready = False
        self._closed = False

    def index_of(self, kind: str) -> str:
        """Index name of ``kind`` (``"anomalies"`` or ``"rootcauses"``)."""
        return f"{self.index_prefix}-{kind}"

    def write(self, record: SinkRecord) -> None:
        """Buffer one record as a document; flush when ``max_batch`` are buffered.

        Raises:
            SinkError: not retryable after :meth:`close`; else as :meth:`flush`.
        """
        if self._closed:
            raise SinkError("OpenSearchSink is closed", retryable=False)
        action, doc = bulk_action(record, self.index_prefix)
        meta = action["index"]
        key = (meta["_index"], meta["_id"])
        pending = self._buffer.get(key)
        if pending is None or pending[0]["index"].get("version", 0) <= meta.get(
            "version", 0
        ):
            self._buffer[key] = (action, json.dumps(doc, separators=(",", ":")))
        if len(self._buffer) >= self._max_batch:
            self.flush()

    @property
    def pending(self) -> int:
        """How many documents wait for the next :meth:`flush`."""
        return len(self._buffer)

    def flush(self) -> None:
        """Send the buffered documents in one ``_bulk`` request.

        Documents that failed retryably stay buffered; the rest are dropped.

        Raises:
            SinkError: the request failed (retryable on connection errors,
                timeouts, 408/429/5xx), or some items failed (retryable when
                any of them may succeed later).
        """
        if not self._buffer:
            return
        self.ensure_templates()
        items = list(self._buffer.items())
        body = "".join(
            json.dumps(a, separators=(",", ":")) + "\n" + d + "\n"
            for _, (a, d) in items
        )
        query = f"?refresh={self._refresh}" if self._refresh else ""
        reply = self._request(
            "POST", f"/_bulk{query}", body.encode(), "application/x-ndjson"
        )
        results = reply.get("items", [])
        if len(results) != len(items):
            raise SinkError(
                f"_bulk answered {len(results)} items for {len(items)}", retryable=True
            )
        retry, fatal = [], []
        for (key, _), result in zip(items, results, strict=True):
            outcome = next(iter(result.values()))
            status = int(outcome.get("status", 0))
            if status < 300 or status == 409:  # 409: a newer revision is stored
                del self._buffer[key]
            elif status in RETRYABLE_STATUS:
                retry.append(f"{key[1]}: {status} {_reason(outcome)}")
            else:
                del self._buffer[key]
                fatal.append(f"{key[1]}: {status} {_reason(outcome)}")
        if retry or fatal:
            detail = "; ".join((retry + fatal)[:5])
            raise SinkError(
                f"_bulk: {len(retry)} items to retry, {len(fatal)} dropped: {detail}",
                retryable=bool(retry),
            )

    def ensure_templates(self) -> None:
        """Create or update both index templates (idempotent; once per sink).

        Raises:
            SinkError: as :meth:`flush`.
        """
        if self._templates_ready:
            return
        for kind in MAPPINGS:
            body = index_template(self.index_of(kind), kind)
            self._request(
                "PUT",
                f"/_index_template/{self.index_of(kind)}",
                json.dumps(body).encode(),
            )
        self._templates_ready = True

    def refresh(self) -> None:
        """Make every indexed document searchable now (tests, demos)."""
        self._request("POST", f"/{self.index_prefix}-*/_refresh", b"")

    def _request(
        self,
        method: str,
        path: str,
        body: bytes,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = self._headers | {"Content-Type": content_type}
        # S310: the scheme was checked to be http(s) in __init__.
        url = self.base_url + path
        req = urllib.request.Request(url, body, headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as resp:  # noqa: S310
                reply: dict[str, Any] = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            with exc:
                text = exc.read(500).decode("utf-8", "replace")
            retryable = exc.code in RETRYABLE_STATUS
            raise SinkError(
                f"{method} {path}: HTTP {exc.code}: {text}", retryable=retryable
            ) from exc
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets, bad JSON
            raise SinkError(f"{method} {path}: {exc}", retryable=True) from exc
        return reply

    def close(self) -> None:
        """Drop what is still buffered (the service flushes first) and refuse writes."""
        if self._buffer:
            logger.warning("closing with %d unflushed documents", len(self._buffer))
        self._buffer.clear()
        self._closed = True


def _reason(outcome: dict[str, Any]) -> str:
    error = outcome.get("error")
    if isinstance(error, dict):
        return f"{error.get('type', '?')}: {error.get('reason', '')}"
    return str(error)


def index_template(index: str, kind: str) -> dict[str, Any]:
    """Body of ``PUT _index_template/<index>`` for index kind ``kind``."""
    return {
        "index_patterns": [index],
        "priority": 100,
        "template": {
            "settings": {"number_of_shards": 1, "number_of_replicas": 0},
            "mappings": {"properties": _COMMON | MAPPINGS[kind]},
        },
    }


def bulk_action(
    record: SinkRecord, index_prefix: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the ``_bulk`` action line and the document of ``record``.

    Raises:
        SinkError: not retryable, for a record type no index holds.
    """
    doc: dict[str, Any] = dataclasses.asdict(record)
    doc["@timestamp"] = record.detected_ns // 1_000_000
    doc["detection_latency_s"] = (record.detected_ns - record.onset_ns) / 1e9
    if isinstance(record, Anomaly):
        anomaly = {"_index": f"{index_prefix}-anomalies", "_id": record.anomaly_id}
        return {"index": anomaly}, doc
    if isinstance(record, RootCause):
        del doc["states_closure"]  # what the decoder saw of the writer
        doc["rca_latency_s"] = record.rca_latency_s
        doc["best"] = doc["culprits"][0] if doc["culprits"] else None
        meta: dict[str, Any] = {
            "_index": f"{index_prefix}-rootcauses",
            "_id": record.incident_id,
            "version": record.revision,
            "version_type": "external_gte",
        }
        return {"index": meta}, doc
    raise SinkError(f"no index for {type(record).__name__}", retryable=False)
