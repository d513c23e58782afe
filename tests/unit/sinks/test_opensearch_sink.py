"""OpenSearchSink against a tiny local fake of ``_index_template`` and ``_bulk``."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mycroft.errors import ConfigError, SinkError
from mycroft.sinks.opensearch import OpenSearchSink
from tests.unit.sinks.records import anomaly, closed, root_cause


class Fake:
    """What the fake server received, and what its next _bulk answers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        self.bulk_status = 200
        self.item_status: list[int] = []


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            fake.requests.append((self.command, self.path, body))
            reply: dict[str, Any] = {"acknowledged": True}
            status = 200
            if self.path.startswith("/_bulk"):
                status = fake.bulk_status
                lines = body.decode().splitlines()[::2]
                codes = fake.item_status or [201] * len(lines)
                items = [
                    {"index": {"_id": json.loads(a)["index"]["_id"], "status": c}
                     | ({"error": {"type": "x", "reason": "y"}} if c >= 300 else {})}
                    for a, c in zip(lines, codes, strict=True)
                ]  # fmt: skip
                reply = {"errors": any(c >= 300 for c in codes), "items": items}
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_PUT = do_POST = _answer  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def fake() -> Iterator[tuple[Fake, str]]:
    state = Fake()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def bulk_lines(fake: Fake) -> list[dict[str, Any]]:
    (_, _, body), *_ = [r for r in fake.requests if r[1].startswith("/_bulk")]
    assert body.endswith(b"\n")
    return [json.loads(line) for line in body.decode().splitlines()]


def test_templates_then_bulk_with_ids_and_versions(fake: tuple[Fake, str]) -> None:
    state, url = fake
    sink = OpenSearchSink(url, "t1", refresh="wait_for")
    sink.write(anomaly("a-9"))
    sink.write(root_cause("i-1", 0))
    sink.write(root_cause("i-1", 2))
    sink.write(root_cause("i-1", 1))  # older than buffered rev 2: kept out
    assert not state.requests  # buffered until flush
    sink.flush()
    puts = [(m, p) for m, p, _ in state.requests if m == "PUT"]
    assert puts == [("PUT", "/_index_template/t1-anomalies"),
                    ("PUT", "/_index_template/t1-rootcauses")]  # fmt: skip
    template = json.loads(state.requests[0][2])
    assert template["template"]["settings"]["number_of_replicas"] == 0
    assert state.requests[-1][1] == "/_bulk?refresh=wait_for"
    lines = bulk_lines(state)
    assert lines[0] == {"index": {"_index": "t1-anomalies", "_id": "a-9"}}
    assert lines[1]["comms"] == [2**64 - 1] and lines[1]["kind"] == "hang"
    rc_meta = {"_index": "t1-rootcauses", "_id": "i-1", "version": 2}
    assert lines[2]["index"] == rc_meta | {"version_type": "external_gte"}
    assert lines[3]["revision"] == 2 and lines[3]["best"]["rank"] == 3
    assert len(lines) == 4 and sink.pending == 0
    sink.write(anomaly("a-10"))
    sink.flush()
    assert sum(m == "PUT" for m, _, _ in state.requests) == 2  # templates once


def test_stale_revision_conflict_is_success(fake: tuple[Fake, str]) -> None:
    state, url = fake
    state.item_status = [409]
    sink = OpenSearchSink(url)
    sink.write(root_cause())
    sink.flush()
    assert sink.pending == 0


def test_item_errors_keep_retryable_drop_others(fake: tuple[Fake, str]) -> None:
    state, url = fake
    state.item_status = [429, 400]
    sink = OpenSearchSink(url)
    sink.write(anomaly("a-1"))
    sink.write(anomaly("a-2"))
    with pytest.raises(SinkError, match="1 items to retry, 1 dropped") as err:
        sink.flush()
    assert err.value.retryable
    assert sink.pending == 1
    state.item_status = []
    sink.flush()
    assert sink.pending == 0
    assert bulk_lines(state)[0]["index"]["_id"] == "a-1"


def test_only_fatal_item_errors_are_not_retryable(fake: tuple[Fake, str]) -> None:
    state, url = fake
    state.item_status = [400]
    sink = OpenSearchSink(url)
    sink.write(anomaly())
    with pytest.raises(SinkError) as err:
        sink.flush()
    assert not err.value.retryable and sink.pending == 0


@pytest.mark.parametrize(
    ("status", "retryable"), [(503, True), (429, True), (400, False)]
)
def test_http_status_decides_retryable(
    fake: tuple[Fake, str], status: int, retryable: bool
) -> None:
    state, url = fake
    state.bulk_status = status
    sink = OpenSearchSink(url)
    sink.write(anomaly())
    with pytest.raises(SinkError, match=f"HTTP {status}") as err:
        sink.flush()
    assert err.value.retryable is retryable
    assert sink.pending == 1


def test_unreachable_server_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = OpenSearchSink(f"http://127.0.0.1:{port}", timeout_s=2)
    sink.write(anomaly())
    with pytest.raises(SinkError) as err:
        sink.flush()
    assert err.value.retryable


@pytest.mark.parametrize(
    ("url", "prefix"), [("ftp://x", "m"), ("http://", "m"), ("http://h:1", "Bad")]
)
def test_bad_config(url: str, prefix: str) -> None:
    with pytest.raises(ConfigError):
        OpenSearchSink(url, prefix)


def test_basic_auth_from_url(fake: tuple[Fake, str]) -> None:
    _, url = fake
    sink = OpenSearchSink(url.replace("http://", "http://u:p%40ss@"))
    assert sink.base_url == url
    assert sink._headers["Authorization"] == "Basic dTpwQHNz"  # u:p@ss


def test_a_closed_revision_replaces_the_open_document(fake: tuple[Fake, str]) -> None:
    state, url = fake
    sink = OpenSearchSink(url, "t1")
    sink.write(root_cause("i-1", 0))
    sink.flush()
    state.requests.clear()
    sink.write(closed(root_cause("i-1", 1)))
    sink.flush()
    meta, doc = bulk_lines(state)
    assert meta["index"]["version"] == 1 and meta["index"]["_id"] == "i-1"
    assert doc["state"] == "closed" and doc["revision"] == 1
    assert doc["closed_ns"] == root_cause().resolved_ns + 5_200_000_000
    assert doc["close_reason"].startswith("quiet for 5.2 s of event time")
    assert "states_closure" not in doc
    assert doc["best"]["rank"] == 3  # the answer it closes with


def test_the_root_cause_template_maps_the_state(fake: tuple[Fake, str]) -> None:
    state, url = fake
    sink = OpenSearchSink(url, "t1")
    sink.write(root_cause())
    sink.flush()
    template = json.loads(state.requests[1][2])
    fields = template["template"]["mappings"]["properties"]
    assert fields["state"] == {"type": "keyword"}
    assert fields["closed_ns"] == {"type": "long"}
