"""Eval accuracy: the share of held-out problems whose completion earns reward 1.

Greedy by default (temperature 0, one completion each): the number a user compares across runs.
"""

from __future__ import annotations

import random
from typing import Sequence

from node.engines.base import Engine
from node.sampling.params import SamplingParams
from node.tasks.base import Problem, Task


def evaluate(engine: Engine, task: Task, problems: Sequence[Problem], max_new_tokens: int,
             temperature: float = 0.0) -> float:
    if not problems:
        raise ValueError("evaluate: no problems")
    params = SamplingParams(n=1, temperature=temperature, max_new_tokens=max_new_tokens)
    results = engine.generate([p.prompt for p in problems], params)
    hits = sum(task.reward(r.completions[0].text, p.answer) for p, r in zip(problems, results))
    return hits / len(problems)


def eval_problems(task: Task, size: int, seed: int = 1234) -> list[Problem]:
    """The held-out problems every run of `task` evaluates on: the same `size` ones whatever the
    command, so that eval figures of `local`, `simulate` and the swarm compare."""
    held = list(task.split("eval"))
    return random.Random(seed).sample(held, min(size, len(held)))
