"""Warn about ``MYCROFT_*`` variables that no command reads.

A setting's variable is ``MYCROFT_<SECTION>__<FIELD>`` (:mod:`mycroft.config`)
and a mistyped one is otherwise silently ignored: the command runs with the
default, which for ``MYCROFT_SINKS__SECURTY_PROTOCOL`` means plain text. Every
``mycroft`` command checks its environment once at start and names each
variable it does not know, with the closest one it does.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Iterator, Mapping

from mycroft.config import env_names
from mycroft.kafka_security import KEYS, env_prefixes

SETTINGS = {
    "agent": "mycroft.producers.agent.config:Settings",
    "streams": "mycroft.streams.faust_settings:StreamSettings",
    "sinks": "mycroft.sinks.service:SinksSettings",
    "topics": "mycroft.admin:TopicsSettings",
    "replay": "mycroft.producers.replay:ReplaySettings",
    "broker": "mycroft.infra.kafka_broker:BrokerSettings",
    "incidents": "mycroft.incidents:IncidentsSettings",
}
"""Section -> the settings dataclass whose fields are its variables."""

OTHER = frozenset({
    "MYCROFT_CONFIG", "MYCROFT_DEBUG", "MYCROFT_CACHE_DIR", "MYCROFT_JOB_ID",
    "MYCROFT_RANK", "MYCROFT_RING_DIR", "MYCROFT_CUDART", "MYCROFT_BOOTSTRAP",
    "MYCROFT_TOPIC_PREFIX", "MYCROFT_BROKER_DIR", "MYCROFT_BROKER_HEAP_MB",
    "MYCROFT_KEYSTORE_PASSWORD", "MYCROFT_PROMETHEUS_BIN", "MYCROFT_PROMTOOL_BIN",
    "MYCROFT_ALERTMANAGER_BIN", "MYCROFT_OPENSEARCH_USER", "MYCROFT_TEST_BROKER",
    "MYCROFT_TEST_OPENSEARCH", "MYCROFT_TEST_NCCL_PLUGIN",
})  # fmt: skip
"""Variables outside any section: the config file, debugging, tests, tools."""

SECURED = ("agent", "streams", "sinks", "topics", "incidents", "replay")
"""Sections whose command reads ``MYCROFT_<SECTION>__<KEY>`` for its Kafka
security, then the shared ``MYCROFT_<KEY>``
(:func:`mycroft.kafka_security.env_prefixes`)."""

FAMILIES = ("MYCROFT_TORCH_", "MYCROFT_NCCL_", "MYCROFT_KAFKA__")
"""Prefixes read by the tracers in the training process (the torch tracer,
the NCCL plugin) and the agent's librdkafka pass-through, whose names are
open-ended."""


def _section_names(section: str, path: str) -> Iterator[str]:
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    for f in dataclasses.fields(cls):
        if "mycroft" in f.metadata:
            yield from env_names(section, f)
    for prefix in env_prefixes(section if section in SECURED else ""):
        yield from (prefix + key.upper() for key in KEYS)


def known_variables() -> frozenset[str]:
    """Every ``MYCROFT_*`` name some command reads (families aside)."""
    names = set(OTHER)
    for section, path in SETTINGS.items():
        names.update(_section_names(section, path))
    return frozenset(names)


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """One line per ``MYCROFT_*`` variable of ``env`` no command reads,
    naming the closest known one."""
    given = [
        name for name in env
        if name.startswith("MYCROFT_") and name not in OTHER
        and not name.startswith(FAMILIES)
    ]  # fmt: skip
    if not given:
        return []
    known = known_variables()
    bare = {name.removeprefix("MYCROFT_"): name for name in known}
    lines = []
    for name in sorted(set(given) - known):
        # Compared without the prefix every name shares, or any would do.
        close = difflib.get_close_matches(name[8:], bare, n=1, cutoff=0.75)
        hint = f"; did you mean {bare[close[0]]}?" if close else ""
        lines.append(f"mycroft: ignoring unknown variable {name}{hint}")
    return lines
