"""Typed configuration: one tree of dataclasses, read from a TOML file, then overridden by CLI flags.

    cfg = load_config(LocalConfig, "run.toml", {"steps": 100, "learner.lr": 1e-5})

Every command's root (`local`: node/local.py; `simulate` and `join`: cli/config.py) is composed of the
same blocks, each field declared once with one default: `ModelBlock` (model, device, dtype),
`ProcessBlock` (seed, threads), `RunBlock` (steps, time budget, outputs: the finite runs) here, and
`TablesBlock` (node/tables.py): the tables every command reads with the same meaning, `[task]`,
`[sampling]` (how completions are drawn: read by learners and samplers alike), `[learner]`. Nested tables are nested
dataclasses; a `task` table picks its kind with `kind = "arithmetic"` (default) or `"dataset"`.
Values are checked against the field types before anything runs: an unknown key, a wrong type
or an out-of-range value is a `ConfigError` that names the file, the key and the fix, so a typo
never silently falls back to a default and a bad value never surfaces deep inside a run. A file
written for another command (`ConfigKind`: the CLI names its commands' configs) is recognised as
such, and an empty file is run on defaults with a warning. A key that was renamed (a class's
`RENAMED`: old key -> its new dotted place) still works, with a warning that names the new key.
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

from node.models import BUILTIN_MODEL
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


DEVICES = "auto, cpu, cuda or cuda:N"
DTYPES = ("auto", "float32", "bfloat16")


class DeviceError(ValueError):
    """A --device/--dtype a user must change: the message says what is wrong, `fix` what to pass."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.fix = fix


def check_spec(device: str, dtype: str) -> None:
    """Syntax only (no GPU probing, no torch): for config validation on any machine (node/device.py
    resolves a spec on this one)."""
    if device not in ("auto", "cpu", "cuda") and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise DeviceError(f"device {device!r} is not one of {DEVICES}", "pass --device auto (or cpu, cuda, cuda:1)")
    if dtype not in DTYPES:
        raise DeviceError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}", "pass --dtype auto (or float32, bfloat16)")


@dataclasses.dataclass(kw_only=True)
class Block:
    """The base of the shared blocks: each block's checks run, whatever root composes it."""

    def __post_init__(self) -> None:
        pass


@dataclasses.dataclass(kw_only=True)
class ModelBlock(Block):
    """What model a command runs, where, and in which precision (`local`, `simulate`, `join`)."""

    model: str = BUILTIN_MODEL
    """A Hugging Face model folder or hub id (default: the built-in tiny model)."""
    device: str = "auto"
    """auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N (node/device.py)."""
    dtype: str = "auto"
    """Compute dtype: float32 or bfloat16; auto is bfloat16 on a GPU (a learner keeps float32 master
    weights; a sampler generates in bfloat16, which the learner's audit by race margin passes) and
    float32 on the CPU."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_spec(self.device, self.dtype)


@dataclasses.dataclass(kw_only=True)
class ProcessBlock(Block):
    """The process's randomness and threads (`local`, `simulate`, `join`)."""

    seed: int = 0
    threads: int | None = None
    """torch CPU threads (default: $HETERO_NODE_THREADS, else torch's own choice: the cores)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.threads is not None and self.threads < 1:
            raise ValueError("need threads >= 1 (or leave it out: torch's own choice)")

    def apply(self) -> None:
        """Seed Python's and torch's RNGs and set torch's threads, as this block says."""
        import os
        import random

        import torch

        torch.manual_seed(self.seed)
        random.seed(self.seed)
        threads = self.threads or int(os.environ.get("HETERO_NODE_THREADS", "0") or 0)
        if threads:
            torch.set_num_threads(threads)


@dataclasses.dataclass(kw_only=True)
class RunBlock(Block):
    """A finite run and what it writes (`local`, `simulate`; a `join` runs until stopped)."""

    steps: int = 300
    """Optimizer steps."""
    time_budget_s: float | None = None
    """Stop after this many seconds (a final evaluation still runs)."""
    metrics_path: str | None = None
    """JSONL file with one line per step (and per evaluation)."""
    tensorboard_dir: str | None = None
    """Also write TensorBoard event files here."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 1 or (self.time_budget_s is not None and self.time_budget_s <= 0):
            raise ValueError("need steps >= 1 and time_budget_s > 0")


def task_from_dict(d: dict[str, Any], where: str = "task") -> TaskConfig:
    d = dict(d)
    kind = d.pop("kind", "arithmetic")
    if kind not in TASK_KINDS:
        raise ConfigError(f"{where}.kind must be one of {sorted(TASK_KINDS)}, not {kind!r}")
    return from_dict(TASK_KINDS[kind], d, where)


def task_to_dict(task: TaskConfig) -> dict[str, Any]:
    """A [task] table as `task_from_dict` reads it back (its kind named): what a learner tells the
    samplers it serves its model to (swarm/wire/model_files.py)."""
    kind = next(k for k, cls in TASK_KINDS.items() if isinstance(task, cls))
    return {"kind": kind, **dataclasses.asdict(task)}


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


def upgrade(cls: type, d: dict[str, Any], where: str = "config", renamed: list[str] | None = None) -> dict[str, Any]:
    """`d` with the keys `cls` renamed (its `RENAMED`: old key -> new dotted place) moved to their new
    place, in nested tables too; each move is appended to `renamed` as "old -> new". ConfigError if
    a table sets both a key's old name and its new one."""
    if not (dataclasses.is_dataclass(cls) and isinstance(d, dict)):
        return d
    out = dict(d)
    for old, new in getattr(cls, "RENAMED", {}).items():
        if old not in out:
            continue
        *parents, leaf = new.split(".")
        node = out
        for part in parents:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        at = f"{where}.{new}" if where != "config" else new
        if leaf in node:
            raise ConfigError(f"{at} is set twice: as {old!r} (its old name) and as {leaf!r}", f"keep {at} only")
        node[leaf] = out.pop(old)
        if renamed is not None:
            renamed.append(f"{f'{where}.' if where != 'config' else ''}{old} -> {at}")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in out and dataclasses.is_dataclass(hints.get(f.name)):
            out[f.name] = upgrade(hints[f.name], out[f.name], f"{where}.{f.name}" if where != "config" else f.name,
                                  renamed)
    return out


def from_dict(cls: type[T], d: dict[str, Any], where: str = "config") -> T:
    said: list[str] = []
    d = upgrade(cls, d, where, said)
    for move in said:
        logger.warning("config key %s: the old name still works; rename it", move)
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
        """Its top-level keys, old names included."""
        module, name = self.config.split(":")
        cls = getattr(importlib.import_module(module), name)
        return {f.name for f in dataclasses.fields(cls)} | set(getattr(cls, "RENAMED", {}))


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
    # renamed keys moved before the flags are laid over the file: a flag sets the new name, and wins
    said: list[str] = []
    try:
        data = upgrade(cls, data, renamed=said)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}", e.fix) from None
    for move in said:
        logger.warning("%s: %s (the old name still works; rename it)", path, move)
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
