"""What a task is: problems with a prompt and a gold answer, a train/eval split, and a reward.

A task is deterministic under a seed so that every peer of a swarm draws the same prompts from
the same ids, and a learner can look a prompt up by id to recompute the reward itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Protocol, Sequence

RewardFn = Callable[[str, str], float]
"""reward(completion_text, gold_answer) -> reward in [0, 1]. Pure: no state, no I/O."""


@dataclass(frozen=True)
class Problem:
    """One prompt of a task. `id` is stable across peers and runs (it names the problem)."""

    id: str
    prompt: str
    answer: str


class Task(Protocol):
    """The seam between a task and the roles: ids, prompts and a verifiable reward."""

    name: str

    def split(self, which: str) -> Sequence[Problem]:
        """All problems of the split `which` ('train' or 'eval'); the two are disjoint."""
        ...

    def get(self, problem_id: str) -> Problem | None:
        """The problem with this id, or None if the task has no such problem."""
        ...

    def reward(self, completion: str, answer: str) -> float:
        ...


def in_eval_split(text: str, fraction: float) -> bool:
    """Whether the problem `text` is held out: a hash of the text, so the split is the same on every
    peer, independent of any seed, and train and eval are disjoint by construction."""
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return h % 1_000_000 < fraction * 1_000_000


class SplitTask:
    """`split` and `get` for a task that builds its problems once, in `_load_splits()`."""

    name: str

    def _load_splits(self) -> dict[str, list[Problem]]:
        """{"train": [...], "eval": [...]}, disjoint."""
        raise NotImplementedError

    @cached_property
    def _splits(self) -> dict[str, list[Problem]]:
        return self._load_splits()

    @cached_property
    def _by_id(self) -> dict[str, Problem]:
        return {p.id: p for s in self._splits.values() for p in s}

    def split(self, which: str) -> Sequence[Problem]:
        if which not in self._splits:
            raise ValueError(f"split must be 'train' or 'eval', not {which!r}")
        return self._splits[which]

    def get(self, problem_id: str) -> Problem | None:
        return self._by_id.get(problem_id)
