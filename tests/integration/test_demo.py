"""The README's demo command runs the whole pipeline and ends with a root cause."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from mycroft.demo import _parser, run

pytestmark = pytest.mark.integration


def test_demo_names_a_root_cause_end_to_end(tmp_path: Path) -> None:
    args = _parser().parse_args(
        ["--duration", "20", "--fault", "gpu-hang:at=8", "--workdir", str(tmp_path)]
    )
    out = io.StringIO()
    code = run(args, out)
    text = out.getvalue()
    assert code == 0, text
    assert "stream worker ready" in text
    assert "ROOT CAUSE rev 0" in text
    assert "injected (ground truth" in text
