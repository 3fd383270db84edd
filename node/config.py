"""Typed configuration: dataclasses built from a TOML file, then overridden by CLI flags.

    cfg = load_config(LocalConfig, "run.toml", {"steps": 100})

Nested dataclass fields take TOML tables; a `task` table picks its kind with `kind =
"arithmetic"` (default) or `kind = "dataset"`. Unknown keys are errors that list the valid ones,
so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .tasks import ArithmeticConfig, DatasetTaskConfig

T = TypeVar("T")
TASK_KINDS = {"arithmetic": ArithmeticConfig, "dataset": DatasetTaskConfig}


def task_from_dict(d: dict[str, Any]) -> ArithmeticConfig | DatasetTaskConfig:
    d = dict(d)
    kind = d.pop("kind", "arithmetic")
    if kind not in TASK_KINDS:
        raise ValueError(f"task.kind must be one of {sorted(TASK_KINDS)}, not {kind!r}")
    return from_dict(TASK_KINDS[kind], d, "task")


def from_dict(cls: type[T], d: dict[str, Any], where: str = "config") -> T:
    hints = typing.get_type_hints(cls)
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - valid
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(valid)}")
    kwargs = {}
    for key, value in d.items():
        hint = hints[key]
        if key == "task" and isinstance(value, dict):
            value = task_from_dict(value)
        elif dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = from_dict(hint, value, f"{where}.{key}")
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            item = typing.get_args(hint)[0]
            if dataclasses.is_dataclass(item):
                value = tuple(from_dict(item, v, f"{where}.{key}[{i}]") for i, v in enumerate(value))
            else:
                value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def load_config(cls: type[T], path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> T:
    """`cls` from the TOML file at `path` (optional), then `overrides` (None values are ignored)."""
    data: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return from_dict(cls, data)
