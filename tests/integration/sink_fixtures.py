"""Real Prometheus and OpenSearch for the sink integration tests.

Import the fixtures into a test module (``from tests.integration.sink_fixtures
import opensearch_url``). As with Kafka, a missing service skips the test
locally and **fails** it when ``CI`` is set: in CI they must run.

* ``MYCROFT_TEST_OPENSEARCH=http://host:port`` uses an existing cluster;
  otherwise :class:`~mycroft.infra.opensearch.OpenSearchServer` starts one
  (fetched from Maven Central once into ``.cache/``).
* Prometheus is Debian's ``prometheus`` binary, started per test so its
  scrape targets can be the test's own endpoints.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from mycroft.errors import MycroftError
from mycroft.infra.opensearch import OpenSearchServer
from mycroft.infra.prometheus import PrometheusServer
from tests.services import unavailable


@pytest.fixture(scope="session")
def opensearch_url() -> Iterator[str]:
    """Base URL of one OpenSearch node shared by the session."""
    external = os.environ.get("MYCROFT_TEST_OPENSEARCH", "").strip().rstrip("/")
    if external:
        try:
            with urllib.request.urlopen(f"{external}/_cluster/health", timeout=10):  # noqa: S310
                pass
        except OSError as exc:
            unavailable("OpenSearch", f"MYCROFT_TEST_OPENSEARCH={external!r}: {exc}")
        yield external
        return
    server = OpenSearchServer()
    error = None
    try:
        server.start()
    except MycroftError as exc:
        error = str(exc)
    if error is not None:
        server.close()
        unavailable("OpenSearch", error)
    yield server.url
    server.close()


class StartPrometheus(Protocol):
    """``start(targets, rule_files, alertmanagers) -> PrometheusServer``."""

    def __call__(
        self,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        alertmanagers: Sequence[str] = (),
    ) -> PrometheusServer: ...


@pytest.fixture
def start_prometheus() -> Iterator[StartPrometheus]:
    """Start Prometheus scraping ``targets`` every second (rules evaluated
    every second, alerts sent to ``alertmanagers``)."""
    servers: list[PrometheusServer] = []

    def start(
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        alertmanagers: Sequence[str] = (),
    ) -> PrometheusServer:
        server = PrometheusServer(
            targets, rule_files=rule_files, alertmanagers=alertmanagers
        )
        servers.append(server)
        error = None
        try:
            server.start()
        except MycroftError as exc:
            error = str(exc)
        if error is not None:
            unavailable("Prometheus", error)
        return server

    yield start
    for server in servers:
        server.close()
