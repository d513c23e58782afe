"""Every package folder is declared in pyproject, and the core stays pure."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _config() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed() -> None:
    setuptools = _config()["tool"]["setuptools"]  # type: ignore[index]
    listed = set(setuptools["packages"])
    mapping = setuptools["package-dir"]
    for package, folder in mapping.items():
        assert package in listed
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *rel.parts]) if rel.parts else package
            assert name in listed, (
                f"{name} ({init.parent}) missing from pyproject packages"
            )


FORBIDDEN = (
    "faust",
    "confluent_kafka",
    "aiokafka",
    "prometheus_client",
    "opensearchpy",
    "mycroft.sinks",
    "mycroft.producers",
    "mycroft.kafka_client",
    "mycroft.streams.app",
)


def test_the_core_imports_no_kafka_faust_or_sinks() -> None:
    for path in (ROOT / "streams" / "core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"
