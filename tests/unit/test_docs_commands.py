"""The ``mycroft`` commands the docs show are commands that work.

Every ``mycroft ...`` command line in every README.md, docs/*.md,
infra/SECURITY.md and streams/SCALING.md (code spans and shell blocks) is
checked against the command's own ``--help``: its subcommand exists and it
takes every flag the line gives. The cheap ones, those that need no broker,
no service and no placeholder filled in, are run for real, in the order the
README gives them (``simulate`` writes the ``run.trace`` that ``analyze`` then reads).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from mycroft import cli

ROOT = Path(__file__).parents[2]
SKIP = {".venv", ".cache", "build", "dist", "node_modules", ".git"}
DOCS = sorted(
    p for p in [
        *ROOT.glob("**/README.md"), *ROOT.glob("docs/*.md"),
        ROOT / "infra" / "SECURITY.md", ROOT / "streams" / "SCALING.md",
    ]
    if not SKIP & set(p.relative_to(ROOT).parts)
)  # fmt: skip
"""Every README of the repository, the docs folder, the security and scaling
guides."""
SPAN = re.compile(r"`([^`\n]*\bmycroft [^`\n]*)`")
FENCE = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.S)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ACTIONS = {
    "topics": {"create", "list"},
    "incidents": {"list", "show", "follow"},
    "streams": {"worker"},
    "broker": {"fetch", "start", "stop", "status"},
    "nccl-plugin": {"path"},
    "prometheus": {"start", "stop"},
    "opensearch": {"fetch", "start", "stop"},
}
NO_POSITIONALS = {"sinks", "agent", "demo"}
"""Commands whose lines go on with flags only (``mycroft sinks run`` is wrong)."""
CHEAP = {("topics", "list"), ("simulate", ""), ("analyze", ""), ("nccl-plugin", "")}
"""(command, action) run for real when the line has no placeholder, no
service to reach (``--bootstrap``) and nothing it would start."""
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\.\.\.|[\[\]<>|$]")


@dataclass(frozen=True)
class Line:
    """One documented command line."""

    doc: str
    text: str

    @property
    def words(self) -> list[str]:
        """The words from ``mycroft`` on, without ``--debug``."""
        after = self.text[self.text.index("mycroft ") :]
        words = after.replace("\\|", "|").split()
        return [w for w in words[1:] if w != "--debug"]

    @property
    def command(self) -> tuple[str, str]:
        """``(command, action)``; the action is '' for single-action commands."""
        name = self.words[0] if self.words else ""
        rest = self.words[1:2]
        action = rest[0] if rest and rest[0] in ACTIONS.get(name, set()) else ""
        return name, action

    @property
    def flags(self) -> set[str]:
        """The flags the line gives its command (not a nested command's)."""
        text = " ".join(self.words)
        text = re.sub(r"\$\([^)]*\)", "", text)  # $(python -m ... --hook-dir)
        text = re.sub(r'"[^"]*"', "", text)  # --sim-args "--ranks 8 ..."
        return set(FLAG.findall(text)) - {"--help", "--debug"}


def _lines(path: Path) -> list[Line]:
    text = path.read_text("utf-8")
    found = [m.group(1) for m in SPAN.finditer(text)]
    for block in FENCE.findall(text):
        joined = block.replace("\\\n", " ")
        found += [ln.split("#")[0] for ln in joined.splitlines() if "mycroft " in ln]
    doc = str(path.relative_to(ROOT))
    out = []
    for text in found:
        for part in re.split(r"(?:;|&&|\|\|| or |, or |\bthen\b)\s*", text):
            if re.search(r"(^|\s|=\S*\s)mycroft [a-z]", part) and "import " not in part:
                out.append(Line(doc, part.strip().rstrip("&").strip()))
    return out


def documented() -> list[Line]:
    """Every command line of the docs, in order, each once."""
    seen: dict[str, Line] = {}
    for path in DOCS:
        for line in _lines(path):
            if line.command[0] in cli.COMMANDS:
                seen.setdefault(line.text, line)
    return list(seen.values())


def _help(name: str, action: str) -> str:
    out = io.StringIO()
    argv = [name, *([action] if action else []), "--help"]
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0, argv
    return out.getvalue()


def test_the_docs_show_commands() -> None:
    lines = documented()
    assert len(lines) > 30
    assert {ln.command[0] for ln in lines} >= {
        "topics", "streams", "agent", "sinks", "incidents", "simulate", "analyze",
        "replay", "broker",
    }  # fmt: skip


@pytest.mark.parametrize("line", documented(), ids=lambda ln: f"{ln.doc}:{ln.text}")
def test_each_documented_command_takes_its_flags(line: Line) -> None:
    name, action = line.command
    if name in ACTIONS and not action and len(line.words) > 1:
        word = line.words[1]
        assert word.startswith("-") or not word.islower(), (
            f"{line.doc}: {word!r} is not an action of mycroft {name}"
        )
    if name in NO_POSITIONALS and len(line.words) > 1:
        assert line.words[1].startswith("-"), (
            f"{line.doc}: mycroft {name} takes no {line.words[1]!r}"
        )
    shown = set(FLAG.findall(_help(name, action)))
    assert line.flags <= shown, f"{line.doc}: {sorted(line.flags - shown)}"


SWITCHES = {"--json", "--verbose", "--open", "--secure", "--create-topics"}


def _mention(words: list[str]) -> bool:
    """``mycroft simulate --out --truth``: flags named in prose, not a run."""
    return any(
        a.startswith("--") and b.startswith("--") and a not in SWITCHES
        for a, b in zip(words, words[1:], strict=False)
    ) or (bool(words) and words[-1].startswith("--") and words[-1] not in SWITCHES)


def _cheap(line: Line) -> bool:
    if line.command not in CHEAP and (line.command[0], "") not in CHEAP:
        return False
    rest = " ".join(line.words[1:])
    if not rest and line.command != ("topics", "list"):
        return False  # `mycroft analyze` named in prose
    return not (
        PLACEHOLDER.search(rest) or "--bootstrap" in rest or _mention(line.words)
    )


def test_the_cheap_ones_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ran = []
    for line in documented():
        if not _cheap(line):
            continue
        argv = shlex.split(" ".join(line.words))
        if argv[0] == "simulate":  # the README's job, shorter: same flags
            argv = [a if a != "30" else "16" for a in argv]
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
        want = {"analyze": {0, 3}, "nccl-plugin": {0, 4}}.get(argv[0], {0})
        assert code in want, f"{line.doc}: mycroft {' '.join(argv)} exited {code}"
        ran.append(argv[0])
    assert {"simulate", "analyze", "topics"} <= set(ran), ran
