"""The ``mycroft`` command: one entry point, one subcommand per job.

Each subcommand lives in the module that owns it and exposes
``main(argv) -> int``; this module only dispatches, so ``mycroft agent`` never
imports faust, scipy or networkx.

Every failure a subcommand lets escape goes through one path
(:mod:`mycroft.cli_errors`): one or two lines on stderr saying what is wrong
and what to do, and the exit code of its class; ``--debug`` (anywhere on the
line, or ``MYCROFT_DEBUG=1``) adds the traceback and Mycroft's debug log
lines (:mod:`mycroft.logs`, the one logging setup of every command).
Commands that need Kafka or OpenSearch are checked to reach them once their
flags parsed (:mod:`mycroft.cli_preflight`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from mycroft.cli_errors import ExitCode, Failure, explain
from mycroft.logs import setup_logging

COMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("mycroft.infra.kafka_broker", "fetch, start, stop a local Kafka broker"),
    "topics": ("mycroft.admin", "create Mycroft's topics (idempotent)"),
    "demo": ("mycroft.demo", "run the live demo end to end on a local broker"),
    "simulate": ("mycroft.producers.sim.cli", "simulate a training job with faults"),
    "replay": ("mycroft.producers.replay", "replay a recorded trace file into Kafka"),
    "agent": ("mycroft.producers.agent.cli", "run the node agent"),
    "nccl-plugin": (
        "mycroft.producers.nccl_plugin",
        "print the built NCCL profiler plugin's path",
    ),
    "analyze": ("mycroft.streams.analyze", "find anomalies and root causes in traces"),
    "incidents": ("mycroft.incidents", "list, show and follow incidents from Kafka"),
    "streams": ("mycroft.streams.app", "run the Faust stream workers"),
    "sinks": ("mycroft.sinks.service", "forward anomalies and root causes to sinks"),
    "prometheus": ("mycroft.infra.prometheus", "start or stop a local Prometheus"),
    "opensearch": ("mycroft.infra.opensearch", "fetch, start, stop a local OpenSearch"),
}


def _usage() -> str:
    lines = ["usage: mycroft [--debug] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<11} {doc}" for name, (_, doc) in COMMANDS.items()]
    lines += [
        "",
        "Run 'mycroft COMMAND --help' for the options of one command;",
        "--debug prints the traceback of a failure. Exit codes: README, 'Exit codes'.",
    ]
    return "\n".join(lines)


def _short_error(parser: argparse.ArgumentParser, message: str, name: str) -> NoReturn:
    """argparse's error, in two lines instead of the whole usage."""
    prog = parser.prog if parser.prog.startswith("mycroft ") else f"mycroft {name}"
    parser.exit(int(ExitCode.USAGE), f"{prog}: {message}\n  see '{prog} --help'\n")


class _Unavailable(Exception):
    """A service the command needs does not answer (raised after its parse)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@contextmanager
def _argparse_hooks(name: str, rest: list[str]) -> Iterator[None]:
    """While a subcommand runs: its parsers report bad flags in two lines, and
    the services it needs are checked once its flags parsed, so a usage error
    is reported before an unreachable broker."""
    from mycroft.cli_preflight import preflight  # noqa: PLC0415

    error, parse_args = (
        argparse.ArgumentParser.error,
        argparse.ArgumentParser.parse_args,
    )
    checked = False

    def parse_then_check(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        nonlocal checked
        parsed = parse_args(self, *a, **kw)
        if not checked:
            checked = True
            if (failure := preflight(name, rest)) is not None:
                raise _Unavailable(failure)
        return parsed

    def short_error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        _short_error(self, message, name)

    # One entry point patches the class for the command's run and restores it.
    argparse.ArgumentParser.error = short_error  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_args = parse_then_check  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = error  # type: ignore[method-assign]
        argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return int(ExitCode.FAILED)


def _report(failure: Failure, name: str, debug: bool = False) -> int:
    lines = failure.lines(name)
    if debug and failure.debug:
        lines.append(f"  {failure.debug}")
    print("\n".join(lines), file=sys.stderr)
    return int(failure.code)


DEPRECATED_FLAGS = {("simulate", "--kafka"): "--bootstrap"}
"""(command, older flag) -> the flag that replaced it; the older still works."""


def _renamed(name: str, rest: list[str]) -> list[str]:
    """``rest`` with the older flags of ``name`` warned about; ``simulate``
    reads its address from ``--kafka`` still, so ``--bootstrap`` goes there."""
    out = []
    for arg in rest:
        flag, eq, value = arg.partition("=")
        if (name, flag) in DEPRECATED_FLAGS:
            print(f"mycroft {name}: {flag} is deprecated; use "
                  f"{DEPRECATED_FLAGS[name, flag]}", file=sys.stderr)  # fmt: skip
        simulate_bootstrap = name == "simulate" and flag == "--bootstrap"
        out.append("--kafka" + eq + value if simulate_bootstrap else arg)
    return out


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the reader went away, and the interpreter's
    own flush at exit must not complain about it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _warn_unknown_variables() -> None:
    from mycroft.env_check import unknown_variables  # noqa: PLC0415

    for line in unknown_variables(os.environ):
        print(line, file=sys.stderr)


def _run(name: str, rest: list[str]) -> int:
    module = importlib.import_module(COMMANDS[name][0])
    with _argparse_hooks(name, rest):
        code: int = module.main(_renamed(name, rest))
    return code


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911 - one return per outcome
    """Dispatch to the subcommand's ``main``; return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("MYCROFT_DEBUG", "") not in {"", "0"}
    args = [a for a in args if a != "--debug"]
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0 if args else int(ExitCode.USAGE)
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"mycroft: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return int(ExitCode.USAGE)
    setup_logging(debug=debug)
    _warn_unknown_variables()
    try:
        return _run(name, rest)
    except SystemExit as exc:  # argparse after --help or a usage error
        return _exit_code(exc)
    except _Unavailable as exc:
        return _report(exc.failure, name, debug)
    except BrokenPipeError:  # `mycroft incidents list | head -1`: a filter
        _quiet_stdout()
        return 0
    except (Exception, KeyboardInterrupt) as exc:  # the one error path
        if debug:
            traceback.print_exc()
        return _report(explain(exc, name, rest), name, debug)
