"""Launchers without starting anything: config, cache paths, missing binaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mycroft.infra import opensearch, prometheus


def test_prometheus_config_scrapes_targets_every_second() -> None:
    config = json.loads(prometheus.render_config(["127.0.0.1:9464"]))
    job = config["scrape_configs"][0]
    assert job["scrape_interval"] == "1s"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9464"]}]


def test_missing_prometheus_names_apt_get(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MYCROFT_PROMETHEUS_BIN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(prometheus.PrometheusError, match="apt-get install -y"):
        prometheus.find_binary()


def test_opensearch_cache_dir_honours_env() -> None:
    path = opensearch.default_cache_dir({"MYCROFT_CACHE_DIR": "/c"})
    assert path == Path("/c") / f"opensearch-{opensearch.VERSION}"
    assert opensearch.VERSION.startswith("2.19.")


def test_jvm_paths_point_into_workdir(tmp_path: Path) -> None:
    options = tmp_path / "jvm.options"
    options.write_text("-XX:HeapDumpPath=data\n9-:-Xlog:gc*:file=logs/gc.log\n")
    opensearch._absolute_jvm_paths(options, Path("/w"))
    text = options.read_text()
    assert "HeapDumpPath=/w/data" in text and "file=/w/logs/gc.log" in text
