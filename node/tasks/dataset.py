"""A task from local question/answer files (JSONL or Parquet), scored by math-verify.

For users with real models and real data (GSM8K- or MATH-style files they have on disk). Files
are read through `datasets`, which never touches the hub for local paths.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .base import Problem, SplitTask
from .rewards import load_reward

DEFAULT_TEMPLATE = "{question}\nPut the final answer in \\boxed{{}}.\n"


@dataclass(frozen=True)
class DatasetTaskConfig:
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...] = ()
    """Held-out files; when empty, `eval_fraction` of the train files is held out by hash."""
    question_field: str = "question"
    answer_field: str = "answer"
    prompt_template: str = DEFAULT_TEMPLATE
    reward: str = "math_verify"
    eval_fraction: float = 0.05
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not self.train_files:
            raise ValueError("dataset task: give at least one train file (.jsonl, .json or .parquet)")
        for f in (*self.train_files, *self.eval_files):
            if Path(f).suffix not in {".jsonl", ".json", ".parquet"}:
                raise ValueError(f"dataset task: {f} is not .jsonl, .json or .parquet")
            if not Path(f).is_file():
                raise ValueError(f"dataset task: file {f} does not exist (paths are relative to the "
                                 f"folder you run hetero-node in)")


def _load_rows(files: Sequence[str], q: str, a: str) -> list[tuple[str, str]]:
    import datasets  # lazy: heavy import

    kind = "parquet" if Path(files[0]).suffix == ".parquet" else "json"
    ds = datasets.load_dataset(kind, data_files=list(files), split="train")
    missing = {q, a} - set(ds.column_names)
    if missing:
        raise ValueError(f"dataset task: {files} lack the field(s) {sorted(missing)}; "
                         f"they have {ds.column_names} (set question_field/answer_field)")
    return [(str(r[q]), str(r[a])) for r in ds]


def _problem_id(question: str) -> str:
    return "ds:" + hashlib.blake2b(question.encode(), digest_size=10).hexdigest()


class DatasetTask(SplitTask):
    def __init__(self, cfg: DatasetTaskConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name or Path(cfg.train_files[0]).stem
        self._reward = load_reward(cfg.reward)

    def _to_problems(self, rows: list[tuple[str, str]]) -> list[Problem]:
        return [Problem(_problem_id(q), self.cfg.prompt_template.format(question=q), a) for q, a in rows]

    def _load_splits(self) -> dict[str, list[Problem]]:
        c = self.cfg
        train = self._to_problems(_load_rows(c.train_files, c.question_field, c.answer_field))
        if c.eval_files:
            held = self._to_problems(_load_rows(c.eval_files, c.question_field, c.answer_field))
            held_ids = {p.id for p in held}
            return {"train": [p for p in train if p.id not in held_ids], "eval": held}
        cut = int(c.eval_fraction * 2**32)
        is_eval = [int(p.id[3:11], 16) < cut for p in train]
        return {"train": [p for p, e in zip(train, is_eval) if not e],
                "eval": [p for p, e in zip(train, is_eval) if e]}

    def reward(self, completion: str, answer: str) -> float:
        return self._reward(completion, answer)
