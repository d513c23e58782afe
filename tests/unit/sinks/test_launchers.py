"""Launchers without starting anything: config, cache paths, missing binaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mycroft.infra import alertmanager, opensearch, prometheus
from mycroft.sinks.lag import partition_lag


def test_prometheus_config_scrapes_targets_every_second() -> None:
    config = json.loads(prometheus.render_config(["127.0.0.1:9464"]))
    job = config["scrape_configs"][0]
    assert job["scrape_interval"] == "1s"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9464"]}]


def test_prometheus_config_loads_rules_and_sends_to_alertmanagers(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "rules.yml"
    text = prometheus.render_config(
        ["127.0.0.1:9464"], rule_files=[rules], alertmanagers=["127.0.0.1:9093"]
    )
    config = json.loads(text)
    assert config["rule_files"] == [str(rules)]
    (am,) = config["alerting"]["alertmanagers"]
    assert am["static_configs"] == [{"targets": ["127.0.0.1:9093"]}]
    assert "alerting" not in json.loads(prometheus.render_config(["h:1"]))


def test_alertmanager_config_routes_every_alert_to_the_webhook() -> None:
    config = json.loads(alertmanager.render_config("http://127.0.0.1:1/hook"))
    assert config["route"]["receiver"] == "mycroft"
    assert config["route"]["group_by"] == ["alertname", "job_id"]
    (receiver,) = config["receivers"]
    (hook,) = receiver["webhook_configs"]
    assert hook == {"url": "http://127.0.0.1:1/hook", "send_resolved": True}
    assert (
        "webhook_configs"
        not in json.loads(alertmanager.render_config(None))["receivers"][0]
    )


def test_missing_alertmanager_names_apt_get(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MYCROFT_ALERTMANAGER_BIN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(alertmanager.AlertmanagerError, match="prometheus-alertmanager"):
        alertmanager.find_binary()


def test_partition_lag_counts_past_the_commit() -> None:
    assert partition_lag(committed=90, low=0, high=100) == 10
    assert partition_lag(committed=-1001, low=40, high=100) == 60  # never committed
    assert partition_lag(committed=10, low=40, high=100) == 60  # commit expired
    assert partition_lag(committed=100, low=0, high=100) == 0


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
