"""Settings of every command: defaults < config file < environment < flags.

A command declares its settings as a frozen dataclass whose fields are made
with :func:`setting` (a doc line, optional extra environment names).
:func:`add_flags` gives each field a flag, :func:`load` merges the layers and
converts every value to its field's type, then the dataclass validates the
whole. Library code takes the frozen object, never the parsed flags.

Where a value comes from, first match wins:

1. the flag, ``--retries 3``;
2. the environment, ``MYCROFT_<SECTION>__<FIELD>`` (``MYCROFT_SINKS__RETRIES``),
   then the older names a field lists (``MYCROFT_BOOTSTRAP``);
3. the ``[<section>]`` table of the TOML file named by ``--config`` or
   ``MYCROFT_CONFIG``;
4. the field's default.

An error names the source and the field: ``MYCROFT_SINKS__RETRIES='x':
retries must be an integer``.

Commands that read it, each from its own section: ``agent`` (``[agent]``),
``streams worker`` (``[streams]``), ``sinks`` (``[sinks]``), ``topics
create`` (``[topics]``), ``replay`` (``[replay]``), ``broker`` (``[broker]``,
from ``MYCROFT_CONFIG`` only: it has no ``--config``) and ``incidents``
(``[incidents]``). These are services or commands pointed at the same Kafka
and folders run after run, so their settings belong in a file.

The others take flags only. ``analyze``, ``demo`` and ``simulate`` take
per-run arguments (the traces to read, the job and the faults to simulate,
where to write), which a shared file would only hide; ``analyze`` has no
setting beyond them. ``nccl-plugin`` prints a path, ``topics list`` prints
the declared topics. ``prometheus`` and ``opensearch``, local helpers for
trying Mycroft, take flags only too.

State kept between runs goes under :func:`state_dir`
(``$XDG_STATE_HOME/mycroft/<command>``) unless a setting names a folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mycroft.errors import ConfigError

CONFIG_ENV = "MYCROFT_CONFIG"
"""Variable naming the config file when ``--config`` is not given."""

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def setting(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    env: tuple[str, ...] = (),
    shown: str | None = None,
    choices: tuple[str, ...] = (),
    metavar: str | None = None,
    flag: bool = True,
) -> Any:
    """A dataclass field that is a setting of a command.

    Args:
        default: the value when no layer sets one; none: required.
        doc: the flag's help line, without the default (added for it).
        env: older variable names read after ``MYCROFT_<SECTION>__<FIELD>``;
            ``*`` stands for the field's name (``MYCROFT_*``: ``MYCROFT_JOB_ID``).
        shown: how ``--help`` shows the default, when not ``str(default)``.
        choices: the values allowed (checked by the flag's parser).
        metavar: the flag's placeholder.
        flag: whether the field has a flag (else file and environment only).
    """
    meta = {
        "doc": doc,
        "env": env,
        "shown": shown,
        "choices": choices,
        "metavar": metavar,
        "flag": flag,
    }
    if isinstance(default, list | dict | set):
        raise TypeError("use a tuple or a frozen mapping for a setting's default")
    return dataclasses.field(default=default, metadata={"mycroft": meta})


def _settings(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if "mycroft" in f.metadata]


def env_names(section: str, field: dataclasses.Field[Any]) -> tuple[str, ...]:
    """The variables that set ``field``, in the order they are read."""
    name = field.name.upper()
    own = f"MYCROFT_{section.upper()}__{name}"
    return (own, *(e.replace("*", name) for e in field.metadata["mycroft"]["env"]))


def flag_name(field: dataclasses.Field[Any]) -> str:
    """``--field-name`` of a field."""
    return "--" + field.name.replace("_", "-")


def _shown_default(field: dataclasses.Field[Any]) -> str:
    meta = field.metadata["mycroft"]
    if meta["shown"] is not None:
        return str(meta["shown"])
    if field.default is dataclasses.MISSING:
        return "required"
    value = field.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return repr(value) if value == "" else str(value)


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``: the TOML file of :func:`load`."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=f"TOML settings file (default: ${CONFIG_ENV}, else none)",
    )


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type[Any],
    section: str,
    only: Sequence[str] | None = None,
) -> None:
    """One flag per setting of ``cls`` (those named in ``only``, if given),
    each with its default and variables.

    A flag not given is absent from the parsed namespace, so :func:`load`
    tells it from one given with the default's value.
    """
    hints = typing.get_type_hints(cls)
    for f in _settings(cls):
        meta = f.metadata["mycroft"]
        if not meta["flag"] or (only is not None and f.name not in only):
            continue
        kind = hints[f.name]
        help_text = (
            f"{meta['doc']} (default: {_shown_default(f)}; "
            f"env {', '.join(env_names(section, f))})"
        )
        if kind is bool and f.default is False:  # a switch: --create-topics
            parser.add_argument(
                flag_name(f),
                action="store_const",
                const=True,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        parser.add_argument(
            flag_name(f),
            default=argparse.SUPPRESS,
            action="append" if typing.get_origin(kind) is tuple else "store",
            choices=meta["choices"] or None,
            metavar=meta["metavar"] or _metavar(kind, meta["choices"]),
            help=help_text,
        )


def _metavar(kind: Any, choices: tuple[str, ...]) -> str | None:
    if choices:
        return None
    base = _base_type(kind)
    return {int: "N", float: "X", bool: "on|off"}.get(base)


def _base_type(kind: Any) -> Any:
    """``int`` of ``int``, ``int | None`` and ``tuple[int, ...]``."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        kinds = [k for k in typing.get_args(kind) if k is not type(None)]
        return kinds[0] if len(kinds) == 1 else str
    if typing.get_origin(kind) is tuple:
        return typing.get_args(kind)[0]
    return kind


def convert(value: Any, kind: Any, source: str, name: str) -> Any:
    """``value`` as a ``kind``; a :class:`ConfigError` naming ``source`` if not.

    Strings (flags, variables) are parsed; values from a TOML file must
    already have the type (an integer is taken for a float).
    """
    if typing.get_origin(kind) is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{source}={value!r}: {name} must be a list")
        base = typing.get_args(kind)[0]
        items = [v.strip() if isinstance(v, str) else v for v in items]
        return tuple(convert(v, base, source, name) for v in items if v != "")
    base = _base_type(kind)
    try:
        return _convert(value, base)
    except (TypeError, ValueError):
        what = {int: "an integer", float: "a number", bool: "on or off"}.get(
            base, "a string"
        )
        raise ConfigError(f"{source}={value!r}: {name} must be {what}") from None


def _convert(value: Any, base: Any) -> Any:
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(value)
    if isinstance(value, bool):
        raise TypeError(value)  # True is no port number
    if base is int and isinstance(value, float):
        raise TypeError(value)
    if base in (int, float):
        return base(value)
    if base is Path:
        return Path(str(value))
    if not isinstance(value, str | int | float):
        raise TypeError(value)
    return str(value)


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where commands keep state between runs (the stream worker's tables).

    ``$XDG_STATE_HOME/mycroft``, else ``~/.local/state/mycroft`` (the XDG
    base directory default); a command's ``--data-dir`` overrides it.
    """
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(base).expanduser() / "mycroft"


def config_path(flags: Mapping[str, Any], env: Mapping[str, str]) -> Path | None:
    """The config file: ``--config``, else ``$MYCROFT_CONFIG``, else none."""
    given = flags.get("config") or env.get(CONFIG_ENV)
    return Path(given).expanduser() if given else None


def read_section(path: Path, section: str) -> dict[str, Any]:
    """The ``[section]`` table of a TOML file (empty when it has none); a
    ``.json`` file is read as JSON, an object of sections.

    Raises:
        ConfigError: the file cannot be read or is not TOML (JSON).
    """
    try:
        text = path.read_text("utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    table = data.get(section, {}) if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [{section}] must be a table")
    return table


def load(  # noqa: PLR0913 - the layers, named
    cls: type[T],
    section: str,
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    file_values: Mapping[str, Any] | None = None,
    file_name: str = "",
    extra: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` from its defaults, the file, the environment and the flags.

    Args:
        cls: a frozen dataclass whose settings are :func:`setting` fields.
        section: the file's table and the ``MYCROFT_<SECTION>__`` prefix.
        flags: the parsed flags (``vars(namespace)``); absent keys are not given.
        env: the environment; ``os.environ`` if None.
        file_values: the file's settings when the caller read them itself;
            else the ``[section]`` of :func:`config_path`'s file, if any.
        file_name: how errors name the file of ``file_values``.
        extra: fields that are not settings (a ``KafkaSecurity``), passed as is.

    Raises:
        ConfigError: an unknown key in the file, a value of the wrong type, a
            required setting none gave, or what the dataclass rejects.
    """
    env = os.environ if env is None else env
    if file_values is None:
        path = config_path(flags, env)
        file_values = read_section(path, section) if path else {}
        file_name = f"{path} [{section}]"
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in _settings(cls)}
    unknown = sorted(set(file_values) - set(fields))
    if unknown:
        raise ConfigError(f"{file_name or 'config file'}: unknown {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        found = _layer_value(
            f,
            section,
            flags=flags,
            env=env,
            file_values=file_values,
            file_name=file_name,
        )
        if found is not None:
            source, raw = found
            values[name] = convert(raw, hints[name], source, name)
        elif f.default is dataclasses.MISSING:
            names = " or ".join(env_names(section, f)[:2])
            raise ConfigError(f"{name} is required: give {flag_name(f)} or set {names}")
    return cls(**values, **(extra or {}))


def _layer_value(  # noqa: PLR0913 - one field, every layer
    f: dataclasses.Field[Any],
    section: str,
    *,
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    file_values: Mapping[str, Any],
    file_name: str,
) -> tuple[str, Any] | None:
    """``(source, raw value)`` of the layer that sets ``f``, or None."""
    if f.name in flags and flags[f.name] is not None:
        return flag_name(f), flags[f.name]
    for var in env_names(section, f):
        if var in env:
            return var, env[var]
    if f.name in file_values:
        return f"{file_name or 'config file'} {f.name}", file_values[f.name]
    return None
