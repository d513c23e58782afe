"""The indep-world campaign's halves and summary (``bench/campaign_indep.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def campaign() -> ModuleType:
    return _load("campaign_indep")


def test_the_tune_half_shares_no_seed_with_the_report_half(
    campaign: ModuleType,
) -> None:
    tune = campaign.tune_scenarios(seeds=2, seed_base=5000)
    listed = campaign.WORLD / "scenarios.tsv"
    if not listed.exists():
        pytest.skip(f"no indep world at {campaign.WORLD}")
    report_seeds = {
        int(line.split("\t")[1])
        for line in listed.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert len({s[0] for s in tune}) == len(tune)
    assert not {s[1] for s in tune} & report_seeds
    assert any(s[3] == "none" for s in tune)


def test_the_summary_counts_misses_false_alarms_and_early_incidents(
    campaign: ModuleType,
) -> None:
    rows = [
        {
            "name": "a",
            "healthy": False,
            "culprit_ok": True,
            "component_ok": True,
            "latency_s": 1.0,
            "pre_onset_incidents": 0,
        },
        {
            "name": "b",
            "healthy": False,
            "culprit_ok": True,
            "component_ok": False,
            "latency_s": -4.0,
            "pre_onset_incidents": 2,
        },
        {"name": "c", "error": "analyze rc=1"},
        {"name": "t-healthy-1", "healthy": True, "false_root_causes": 1},
        {"name": "healthy-2", "error": "generator rc=1"},
    ]
    s = campaign.summarize(rows)
    assert (s["fault_runs"], s["culprit_ok"], s["component_ok"]) == (3, 2, 1)
    assert (s["healthy_runs"], s["false_root_causes_healthy"]) == (2, 2)
    assert s["pre_onset_incidents"] == 2
    assert s["fault_runs_with_pre_onset"] == ["b"]
    assert s["detected_after_onset"] == 1 and s["detection_p50_s"] == 1.0
    assert s["errors"] == ["c", "healthy-2"]
