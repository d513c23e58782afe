"""The incident report renders in a real headless Chromium, figures and all."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mycroft.cli import main as cli_main
from tests.services import unavailable

pytestmark = pytest.mark.integration

WIDTH, HEIGHT = 1280, 4000
# Without the networking switches Chromium waits on services a closed
# network never answers.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
    "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
)  # fmt: skip


def chromium() -> str:
    binary = shutil.which("chromium")
    if binary is None:
        unavailable("chromium", "apt-get install -y --no-install-recommends chromium")
    return binary


def screenshot(page: Path, png: Path, profile: Path) -> None:
    """Render ``page`` at WIDTH x HEIGHT into ``png``."""
    profile.mkdir()
    done = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
         f"--window-size={WIDTH},{HEIGHT}", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]


def rgb(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg  # noqa: PLC0415 - the report extra

    pixels = mpimg.imread(path)[..., :3]
    return np.asarray((pixels * 255).round().astype(np.uint8))


def find(shot: np.ndarray, figure: np.ndarray) -> tuple[int, int] | None:
    """Where ``figure`` appears whole, pixel for pixel, in ``shot``."""
    h, w = figure.shape[:2]
    r = int(np.argmax(figure.std(axis=(1, 2))))  # its most varied row
    key = figure[r].tobytes()
    for y, row in enumerate(shot):
        at = row.tobytes().find(key)
        if at < 0 or at % 3:
            continue
        top, x = y - r, at // 3
        if top >= 0 and np.array_equal(shot[top : top + h, x : x + w], figure):
            return top, x
    return None


def test_the_report_renders_with_every_figure(tmp_path: Path) -> None:
    chromium()
    trace, out = tmp_path / "run.trace", tmp_path / "report"
    argv = [
        "simulate", "--ranks", "16", "--tp", "4", "--pp", "2", "--dp", "2",
        "--fault", "nic-down:at=5", "--duration", "10",
        "--out", str(trace), "--truth", str(tmp_path / "truth.json"),
    ]  # fmt: skip
    assert cli_main(argv) == 0
    code = cli_main(["analyze", str(trace), "--report", str(out)])
    assert code in (0, 3)  # 3: a root cause named a culprit
    page = out / "index.html"
    names = re.findall(r'<img src="([^"]+)"', page.read_text())
    assert len(names) == 4
    png = tmp_path / "shot.png"
    screenshot(page, png, tmp_path / "profile")
    shot = rgb(png)
    assert shot.shape == (HEIGHT, WIDTH, 3)
    assert shot.std() > 20  # a page, not a blank canvas
    places = []
    for name in names:
        figure = rgb(out / name)
        assert figure.shape[0] > 200 and figure.std() > 5, name
        where = find(shot, figure)
        assert where is not None, f"{name} is not on the rendered page"
        places.append(where)
    assert places == sorted(places)  # one below the other, in page order
    # The page's own text renders too: the headline sits above the figures.
    assert (shot[: places[0][0], :, :] < 128).any()
