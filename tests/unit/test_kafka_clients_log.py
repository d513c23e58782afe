"""Every librdkafka client Mycroft builds logs through Python logging.

A client built without confluent-kafka's ``logger`` setting prints
librdkafka's own ``%3|...|FAIL|...`` lines on stderr, past Mycroft's log
format, level and rate limit (as the local broker's readiness client did
when Ctrl-C stopped the demo). Each construction must hand it the logger:
directly (``client_logger()``) or through ``producer_config``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mycroft", "producers", "streams", "sinks", "infra")
CLIENTS = {"Producer", "Consumer", "AdminClient"}


def _constructions(tree: ast.AST) -> list[ast.Call]:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    return [c for c in calls if isinstance(c.func, ast.Name) and c.func.id in CLIENTS]


def _configured(function: ast.AST) -> bool:
    """Whether the function building a client names the logger."""
    text = ast.unparse(function)
    return "client_logger()" in text or "producer_config(" in text


def _functions(tree: ast.AST) -> list[ast.AST]:
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return [n for n in ast.walk(tree) if isinstance(n, kinds)]


def test_every_kafka_client_gets_the_python_logger() -> None:
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text("utf-8"))
            for function in _functions(tree):
                for call in _constructions(function):
                    if not _configured(function):
                        missing.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert not missing, f"librdkafka clients without client_logger(): {missing}"
