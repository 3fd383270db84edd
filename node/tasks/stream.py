"""A resumable, seeded stream of problems: shuffled passes, its state is one integer."""

from __future__ import annotations

import random
from typing import Sequence

from node.tasks.base import Problem


class PromptStream:
    """Endless shuffled passes over `problems`; `position` is the whole state (checkpointable)."""

    def __init__(self, problems: Sequence[Problem], seed: int | str, position: int = 0) -> None:
        if not problems:
            raise ValueError("PromptStream: no problems")
        self.problems = problems
        self.seed = seed
        self.position = position
        self._epoch, self._order = -1, list(range(len(problems)))

    def __iter__(self) -> "PromptStream":
        return self

    def __next__(self) -> Problem:
        epoch, i = divmod(self.position, len(self.problems))
        if epoch != self._epoch:
            self._order = list(range(len(self.problems)))
            random.Random(f"{self.seed}:{epoch}").shuffle(self._order)
            self._epoch = epoch
        self.position += 1
        return self.problems[self._order[i]]

    def take(self, n: int) -> list[Problem]:
        return [next(self) for _ in range(n)]
