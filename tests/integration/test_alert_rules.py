"""The alerting rules in infra/prometheus/ pass Debian's promtool.

``promtool check rules`` validates them; ``promtool test rules`` runs their
unit tests (input series, expected alerts with labels and annotations) in
``mycroft-alerts.test.yml``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.services import unavailable

pytestmark = pytest.mark.integration

RULES_DIR = Path(__file__).parents[2] / "infra" / "prometheus"


def _promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("MYCROFT_PROMTOOL_BIN") or shutil.which("promtool")
    if binary is None:
        unavailable("promtool", "apt-get install -y --no-install-recommends prometheus")
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_rules_are_valid() -> None:
    done = _promtool("check", "rules", "mycroft-alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout


def test_rules_unit_tests_pass() -> None:
    done = _promtool("test", "rules", "mycroft-alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    """The unit tests can fail: a wrong expected culprit is reported."""
    text = (RULES_DIR / "mycroft-alerts.test.yml").read_text("utf-8")
    broken = text.replace("rank 33 on node0004", "rank 34 on node0004", 1)
    assert broken != text
    shutil.copy(RULES_DIR / "mycroft-alerts.yml", tmp_path)
    (tmp_path / "broken.test.yml").write_text(broken, "utf-8")
    done = _promtool("test", "rules", "broken.test.yml", cwd=tmp_path)
    assert done.returncode != 0
    assert "rank 33 on node0004" in done.stdout + done.stderr
