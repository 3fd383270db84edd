"""Typed configuration: one tree of dataclasses, read from a TOML file, then overridden by CLI flags.

    cfg = load_config(LocalConfig, "run.toml", {"steps": 100, "learner.lr": 1e-5})

Every command reads the same tables with the same meaning: `[task]`, `[sampling]` (how completions
are drawn: read by learners and samplers alike), `[learner]`. Nested tables are nested
dataclasses; a `task` table picks its kind with `kind = "arithmetic"` (default) or `"dataset"`.
Values are checked against the field types before anything runs: an unknown key, a wrong type
or an out-of-range value is a `ConfigError` that names the file, the key and the fix, so a typo
never silently falls back to a default and a bad value never surfaces deep inside a run. A file
written for another command (`ConfigKind`: the CLI names its commands' configs) is recognised as
such, and an empty file is run on defaults with a warning.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
import types
import typing
from pathlib import Path
from typing import Any, Sequence, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from node.engines.base import SamplingParams
from node.tasks import ArithmeticConfig, ChainConfig, DatasetTaskConfig

T = TypeVar("T")
TaskConfig = ArithmeticConfig | ChainConfig | DatasetTaskConfig
TASK_KINDS = {"arithmetic": ArithmeticConfig, "chain": ChainConfig, "dataset": DatasetTaskConfig}
logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration value a user must fix: `str(e)` says where and what, `fix` how."""

    def __init__(self, what: str, fix: str = "") -> None:
        super().__init__(what)
        self.fix = fix


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How completions are drawn: one `[sampling]` table, read by the learner (which computes
    log-probs at this temperature and refuses other records) and by every sampler."""

    group_size: int = 8
    """Completions per prompt (G); advantages are relative to the group."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 6

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError("sampling.group_size must be >= 2: advantages are relative to the group")
        self.params  # SamplingParams checks the rest

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(n=self.group_size, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=self.max_new_tokens)


def task_from_dict(d: dict[str, Any], where: str = "task") -> TaskConfig:
    d = dict(d)
    kind = d.pop("kind", "arithmetic")
    if kind not in TASK_KINDS:
        raise ConfigError(f"{where}.kind must be one of {sorted(TASK_KINDS)}, not {kind!r}")
    return from_dict(TASK_KINDS[kind], d, where)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """`value` as the type `hint` asks for, or ConfigError saying what was expected."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if hint == TaskConfig:
        if isinstance(value, (ArithmeticConfig, ChainConfig, DatasetTaskConfig)):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, e.g. [task] with kind = \"arithmetic\"")
        return task_from_dict(value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arm, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {hint}")
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table of {hint.__name__} fields, not {value!r}")
        return from_dict(hint, value, where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, not {value!r}")
        item = args[0] if args else Any
        return origin(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, not {value!r}")
        return dict(value)
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
        return value
    raise ConfigError(f"{where} must be {'an' if _type_name(hint)[0] in 'aeiou' else 'a'} {_type_name(hint)}, "
                      f"not {value!r}")


def from_dict(cls: type[T], d: dict[str, Any], where: str = "config") -> T:
    hints = typing.get_type_hints(cls)
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - valid
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(valid)}",
                          "remove or rename the key")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where != "config" else k) for k, v in d.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:  # a __post_init__ check: its message says what to change
        raise ConfigError(f"{where}: {e}" if where != "config" else str(e), getattr(e, "fix", "")) from None


def _nest(overrides: dict[str, Any]) -> dict[str, Any]:
    """{"learner.lr": 1e-5} -> {"learner": {"lr": 1e-5}}; None values (flags not given) dropped."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist", "give the path of a TOML file "
                          "(`hetero-node init` writes examples)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}", "fix the syntax at that line "
                          "(strings need quotes; tables are [name])") from None


@dataclasses.dataclass(frozen=True)
class ConfigKind:
    """One command's config files, so that a file passed to the wrong command is named for what it is."""

    command: str
    """How a user runs it, e.g. "hetero-node join"."""
    config: str
    """Its config class as "module:Class", imported only to recognise a file (cli.roles imports hivemind)."""
    example: str
    """The command that writes an example file, e.g. "hetero-node init sampler"."""

    def fields(self) -> set[str]:
        module, name = self.config.split(":")
        return {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name))}


def written_for(data: dict[str, Any], cls: type, kinds: Sequence[ConfigKind]) -> tuple[ConfigKind, str] | None:
    """The kind of config `data` (a file's tables) was written for, when not `cls`'s: another kind
    knows every top-level key `cls` does not. With the key that gives it away (`role` first)."""
    unknown = [k for k in data if k not in {f.name for f in dataclasses.fields(cls)}]
    if not unknown:
        return None
    own = f"{cls.__module__}:{cls.__qualname__}"
    fits = [k for k in kinds if k.config != own and set(unknown) <= k.fields()]
    if not fits:
        return None
    best = max(fits, key=lambda k: len(set(data) & k.fields()))
    return best, "role" if "role" in unknown else unknown[0]


def load_config(cls: type[T], path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                kinds: Sequence[ConfigKind] = ()) -> T:
    """`cls` from the TOML file at `path` (optional), then `overrides` (dotted keys for nested
    tables; None values are ignored). Raises ConfigError naming the file; one written for another
    of `kinds` (every command's, `cls`'s own included) says so, and which command to run."""
    data = read_toml(path) if path is not None else {}
    if path is not None and not data:
        logger.warning("%s sets nothing: running on defaults", path)
    merged = _merge(data, _nest(overrides or {}))
    try:
        return from_dict(cls, merged)
    except ConfigError as e:
        if path is None:
            raise
        other = written_for(data, cls, kinds)
        if other is None:
            raise ConfigError(f"{path}: {e}",
                              e.fix or f"edit {path} (`hetero-node init` writes commented examples)") from None
        kind, key = other
        own = next((k for k in kinds if k.config == f"{cls.__module__}:{cls.__qualname__}"), None)
        raise ConfigError(f"{path} is a config for `{kind.command}` (it sets {key})",
                          f"run {kind.command} --config {path}" + (
                              f", or {own.example} for a {own.command.split()[-1]} config" if own else "")) from None
