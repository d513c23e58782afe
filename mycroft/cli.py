"""The ``mycroft`` command: one entry point, one subcommand per job.

Each subcommand lives in the module that owns it and exposes
``main(argv) -> int``; this module only dispatches, so ``mycroft agent`` never
imports faust, scipy or networkx.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

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
    "streams": ("mycroft.streams.app", "run the Faust stream workers"),
    "sinks": ("mycroft.sinks.service", "forward anomalies and root causes to sinks"),
    "prometheus": ("mycroft.infra.prometheus", "start or stop a local Prometheus"),
    "opensearch": ("mycroft.infra.opensearch", "fetch, start, stop a local OpenSearch"),
}


def _usage() -> str:
    lines = ["usage: mycroft COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {doc}" for name, (_, doc) in COMMANDS.items()]
    lines += ["", "Run 'mycroft COMMAND --help' for the options of one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the subcommand's ``main``; return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"mycroft: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    code: int = module.main(rest)
    return code
