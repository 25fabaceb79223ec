"""The generic configuration loader: TOML, then environment, then ``--set``, into typed sections.

A configuration is a dataclass of *sections*, each a dataclass owned by the package that acts on it
(``TrainerConfig`` in ``streamrec.trainer``, ``StoreConfig`` in ``streamrec.embedding_store``, ...).
This module knows no section: it coerces values to the declared field types, refuses unknown keys,
applies ``STREAMREC_<SECTION>__<KEY>`` environment variables and ``section.key=value`` overrides, and
writes a configuration back as TOML. Each section checks its own values in ``__post_init__`` by raising
:class:`InvalidValue`, so a section built in code is checked as a loaded one is; the loader prefixes
the key with where the section sits (``model.fields[2].dim: must be >= 0``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import StreamrecError

ENV_PREFIX = "STREAMREC_"


class ConfigError(StreamrecError, ValueError):
    """A configuration key is unknown, missing or has a bad value."""


class InvalidValue(ConfigError):
    """A section's ``key`` holds a value its section refuses; ``message`` says why, in one line."""

    def __init__(self, key: str, message: str, section: str = "") -> None:
        self.key, self.message = key, message
        super().__init__(f"{section + '.' if section else ''}{key}: {message}")


def check_choice(section: str, obj: Any, key: str, allowed: Any) -> None:
    """Refuse ``obj.key`` unless it is one of the values of the ``Literal`` alias ``allowed``.

    The aliases live in the ``*_types`` module of the package that acts on the value, which checks
    against the same ``typing.get_args``: one list of allowed values, and an error that names the
    key, the value and every allowed value in one line."""
    value = getattr(obj, key)
    options = typing.get_args(allowed)
    if value not in options:
        raise InvalidValue(key, f"must be one of {', '.join(options)}, got {value!r}", section)


def check_metrics_endpoint(section: str, obj: Any) -> None:
    """``metrics_port`` / ``metrics_host`` of a process's Prometheus endpoint."""
    if not 0 <= obj.metrics_port <= 65535:
        raise InvalidValue("metrics_port", "must be in 0..65535 (0 = off)", section)
    if not obj.metrics_host.strip():
        raise InvalidValue("metrics_host", "must be an address (127.0.0.1 keeps the endpoint on this machine)",
                           section)


def removed_keys(cls: type) -> Mapping[str, str]:
    """Keys ``cls`` once had, each with what to do instead (its ``REMOVED_KEYS`` class attribute)."""
    return getattr(cls, "REMOVED_KEYS", {})


def _coerce_scalar(value: Any, tp: Any, key: str) -> Any:
    """``value`` as a bool, int, float, str or ``Literal`` string; strings from env/CLI converted."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None and number == number:  # NaN passes every "x <= 0" range check: refuse it here
            return number
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if typing.get_origin(tp) is typing.Literal:  # a string here; which strings: the section's __post_init__
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected one of {', '.join(map(str, typing.get_args(tp)))}, got "
                          f"{type(value).__name__} {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert strings from env/CLI."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None) and value is None:
                return None
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} matches none of {tp}")
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:  # a free-form table: string keys, each value checked against the value type
        inner = typing.get_args(tp)[1]
        return {str(k): _coerce(v, inner, f"{key}.{k}") for k, v in _table(value, key).items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(tp, type) and isinstance(value, tp):
            return value
        return build_section(tp, _table(value, key), key)
    return _coerce_scalar(value, tp, key)


def _table(value: Any, key: str) -> Mapping[str, Any]:
    """``value`` as a table: a mapping as it is, a string from env/CLI read as JSON."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{key}: expected a table, got {value!r}") from e
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a table, got {type(value).__name__} {value!r}")
    return value


@functools.cache
def field_types(cls: type) -> Mapping[str, Any]:
    """``cls``'s resolved field annotations, read once per class (a section's annotations never change after
    its class is defined, and resolving them evaluates every string annotation again)."""
    return types.MappingProxyType(typing.get_type_hints(cls))


def build_section(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    """``cls`` built from ``data`` (a TOML table): unknown or removed keys refused, each value coerced to
    its field's type, the section's own checks run; every error names the key under ``prefix``."""
    hints = field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown and unknown[0] in removed_keys(cls):
        raise ConfigError(f"{prefix + '.' if prefix else ''}{unknown[0]}: {removed_keys(cls)[unknown[0]]}")
    if unknown:
        where = f"[{prefix}]" if prefix else "top level"
        raise ConfigError(f"unknown key {unknown[0]!r} in {where}; known keys: {', '.join(sorted(names))}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: missing required key")
    try:
        return cls(**kwargs)
    except InvalidValue as e:  # the section names the key; the loader knows where the section sits
        raise ConfigError(f"{prefix + '.' if prefix else ''}{e.key}: {e.message}") from None


def _section_class(root: type, section: str) -> type | None:
    hint = field_types(root).get(section)
    return hint if hint is not None and dataclasses.is_dataclass(hint) else None


def _set_nested(root: type, data: dict[str, Any], parts: list[str], value: Any, source: str) -> bool:
    """``section.table.key`` of a nested table (``serving.guard.enabled``); False when it names none."""
    section, table, key = parts
    section_cls = _section_class(root, section)
    inner = field_types(section_cls).get(table) if section_cls is not None else None
    if inner is None or not dataclasses.is_dataclass(inner):
        return False
    keys = {f.name for f in dataclasses.fields(inner)}
    if key not in keys:
        raise ConfigError(f"{source}: unknown key {key!r} in [{section}.{table}]; known keys: {', '.join(sorted(keys))}")
    sec = data.setdefault(section, {})
    if not isinstance(sec.get(table, {}), dict):
        sec[table] = {}
    sec.setdefault(table, {})[key] = value
    return True


def set_path(root: type, data: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    """Set ``section.key`` (or ``section.table.key``) of the raw ``data`` of a ``root`` configuration,
    refusing a name ``root`` does not have; the error names ``source`` (the variable or ``--set``)."""
    parts = dotted.split(".")
    if len(parts) == 3 and all(parts) and _set_nested(root, data, parts, value, source):
        return
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{source}: expected section.key, got {dotted!r}")
    section, key = parts
    sections = {f.name for f in dataclasses.fields(root)}
    section_cls = _section_class(root, section)
    if section not in sections or section_cls is None:
        raise ConfigError(f"{source}: unknown section {section!r}; known: {', '.join(sorted(sections))}")
    keys = {f.name for f in dataclasses.fields(section_cls)}
    if key in removed_keys(section_cls):
        raise ConfigError(f"{source}: {section}.{key} {removed_keys(section_cls)[key]}")
    if key not in keys:
        raise ConfigError(f"{source}: unknown key {key!r} in [{section}]; known keys: {', '.join(sorted(keys))}")
    data.setdefault(section, {})[key] = value


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """The TOML table in ``path``; every way it cannot be read is one :class:`ConfigError` line."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p}: {e}") from e
    except UnicodeDecodeError as e:  # a clear ConfigError, not a traceback from every command
        raise ConfigError(f"config file {p}: not UTF-8 text (TOML must be UTF-8): {e}") from None
    except OSError as e:
        raise ConfigError(f"config file {p}: cannot be read: {e.strerror or e}") from None


def load_sections(
    root: type,
    path: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    migrate: Callable[[dict[str, Any], str], None] | None = None,
) -> Any:
    """Build ``root`` (a dataclass of sections): the file, then ``STREAMREC_SECTION__KEY`` environment
    variables, then ``overrides`` (``"section.key"`` -> a typed value or a string). ``migrate`` rewrites
    the raw data of older layouts before it is built."""
    data: dict[str, Any] = read_toml(path) if path else {}
    env = os.environ if env is None else env
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX):].lower().partition("__")
        # STREAMREC_SERVING__GUARD__ENABLED: a nested table's key
        set_path(root, data, f"{section}.{key.replace('__', '.')}", value, f"environment variable {name}")
    for dotted, value in (overrides or {}).items():
        set_path(root, data, dotted, value, f"override {dotted}")
    if migrate is not None:
        migrate(data, str(path) if path else "")
    return build_section(root, data, "")


def replace_checked(obj: Any, **changes: Any) -> Any:
    """A copy of the section ``obj`` with ``changes``, coerced and checked as loaded values are."""
    hints = field_types(type(obj))
    return dataclasses.replace(obj, **{k: _coerce(v, hints[k], k) for k, v in changes.items()})


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """Turn ``["a.b=1", ...]`` from ``--set`` into a dict."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: expected section.key=value")
        out[key.strip()] = value
    return out


def save_sections(obj: Any, path: str | os.PathLike) -> Path:
    """Write the configuration ``obj`` in full as TOML (what child processes read back)."""
    import tomli_w

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(tomli_w.dumps(dataclasses.asdict(obj)))
    return p
