"""Eval accuracy: the share of held-out problems whose completion earns reward 1.

Greedy by default (temperature 0, one completion each): the number a user compares across runs.
"""

from __future__ import annotations

from typing import Sequence

from .engines.base import Engine, SamplingParams
from .tasks.base import Problem, Task


def evaluate(engine: Engine, task: Task, problems: Sequence[Problem], max_new_tokens: int,
             temperature: float = 0.0) -> float:
    if not problems:
        raise ValueError("evaluate: no problems")
    params = SamplingParams(n=1, temperature=temperature, max_new_tokens=max_new_tokens)
    results = engine.generate([p.prompt for p in problems], params)
    hits = sum(task.reward(r.completions[0].text, p.answer) for p, r in zip(problems, results))
    return hits / len(problems)
