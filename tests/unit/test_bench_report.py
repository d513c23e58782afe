"""bench/report.py: each section's measured-at stamp and the stale check."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def report(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # report.py imports its renderers so
    spec = importlib.util.spec_from_file_location("bench_report", BENCH / "report.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_report", mod)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(mod.MEASURES, "x", ("src",))
    return mod


def _git(root: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    out = subprocess.run(
        ["git", *ident, *args], cwd=root, check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def _commit(root: Path, rel: str, text: str) -> str:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)
    _git(root, "add", rel)
    _git(root, "commit", "-q", "-m", f"change {rel}")
    return _git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, "src/core.py", "A = 1\n")
    return tmp_path


def _stamp(report: ModuleType, repo: Path, data: object) -> Any:
    path = repo / "results" / "x.json"
    return report.stamp("x", data, path, report.Git(repo))


def test_fresh_until_its_code_changes(report: ModuleType, repo: Path) -> None:
    measured = _git(repo, "rev-parse", "HEAD")
    doc = {"commit": measured[:10] + "+changes", "date": "2026-12-01"}
    _commit(repo, "results/x.json", json.dumps(doc))
    st = _stamp(report, repo, doc)
    assert st.stale_since is None and st.date == "2026-12-01"
    _commit(repo, "src/README.md", "docs only\n")
    assert _stamp(report, repo, doc).stale_since is None
    later = _commit(repo, "src/core.py", "A = 2\n")
    st = _stamp(report, repo, doc)
    assert st.stale_since == later
    assert "Stale" in "\n".join(report.stamp_lines(st))


def test_without_a_commit_field_the_files_commit_counts(
    report: ModuleType, repo: Path
) -> None:
    added = _commit(repo, "results/x.json", "{}")
    st = _stamp(report, repo, {})
    assert st.label.startswith(added[:10]) and st.stale_since is None
    assert st.date == _git(repo, "log", "-1", "--format=%cs")
    _commit(repo, "src/core.py", "A = 2\n")
    assert _stamp(report, repo, {}).stale_since is not None


def test_a_result_not_yet_committed_is_fresh(report: ModuleType, repo: Path) -> None:
    (repo / "results").mkdir()
    (repo / "results" / "x.json").write_text("{}")
    st = _stamp(report, repo, {})
    assert st.stale_since is None and st.label == "the working tree"


def test_an_unknown_commit_is_not_called_stale(report: ModuleType, repo: Path) -> None:
    doc = {"commit": "working tree snapshot of 2026-12-07 04:02 UTC"}
    _commit(repo, "results/x.json", json.dumps(doc))
    st = _stamp(report, repo, doc)
    assert st.date == "2026-12-07" and st.stale_since is None


def test_results_files_map_to_their_sources(report: ModuleType) -> None:
    m = report.MEASURES
    assert report.measures("campaign_live_1024") == m["campaign_live_"]
    assert report.measures("campaign_general_tune") == m["campaign_"]
    assert report.measures("two_stage_accuracy") == m["two_stage"]
    assert report.measures("sim_speed") == ("producers/sim",)
    assert report.measures("unknown") == ()
