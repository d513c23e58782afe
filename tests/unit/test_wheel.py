"""The built wheel carries every module and the schemas (the package-dir mapping)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_imports_every_module_and_finds_the_schemas(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(site)
    assert "mycroft/schemas/state.avsc" in names
    assert "mycroft/schemas/history/StateBatch.1.avsc" in names
    assert "mycroft/infra/kafka/pom.xml" in names
    modules = sorted(
        n[:-3].replace("/", ".").removesuffix(".__init__")
        for n in names
        if n.endswith(".py") and not n.endswith("__main__.py")
    )
    script = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        f"for m in {modules!r}:\n"
        "    mod = importlib.import_module(m)\n"
        f"    assert mod.__file__.startswith({str(site)!r}), (m, mod.__file__)\n"
        "from mycroft.schemas.codec import SchemaStore\n"
        "SchemaStore()\n"
    )
    # -I: isolated, so the editable install of the work tree cannot shadow the wheel.
    subprocess.run([sys.executable, "-I", "-c", script], check=True, timeout=120)
