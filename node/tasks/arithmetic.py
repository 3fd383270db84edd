"""The built-in task: integer arithmetic with a difficulty knob and an exact-match reward.

Prompts look like ``"37+58="`` and ``"6*14="``; the answer is the integer, e.g. ``"95"``.
The problem set is enumerable and the split is a hash of the problem text, so train and eval
are disjoint by construction, identical on every peer, and independent of the seed; the seed only
orders the training stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from node.tasks.base import Problem, SplitTask, in_eval_split
from node.tasks.rewards import exact_int_match


@dataclass(frozen=True)
class ArithmeticConfig:
    digits: int = 2
    """Difficulty: the largest operand of '+' has this many digits."""
    mul_digits: int = 1
    """The second factor of '*' has at most this many digits (the first has `digits`)."""
    ops: tuple[str, ...] = ("+", "*")
    eval_fraction: float = 0.1
    """Share of all problems held out for evaluation (chosen by hash, never trained on)."""

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 4 or not 1 <= self.mul_digits <= self.digits:
            raise ValueError("arithmetic: need 1 <= mul_digits <= digits <= 4 (4 digits is 10^8 problems)")
        if not set(self.ops) <= {"+", "*"} or not self.ops:
            raise ValueError("arithmetic: ops must be a non-empty subset of ('+', '*')")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError("arithmetic: eval_fraction must be in (0, 1)")


def _problems(cfg: ArithmeticConfig) -> Iterator[Problem]:
    hi = 10**cfg.digits
    for op in cfg.ops:
        b_hi = hi if op == "+" else 10**cfg.mul_digits
        for a in range(hi):
            for b in range(b_hi):
                value = a + b if op == "+" else a * b
                text = f"{a}{op}{b}="
                yield Problem(id=f"arith:{a}{op}{b}", prompt=text, answer=str(value))


class ArithmeticTask(SplitTask):
    """Addition and multiplication of non-negative integers (see module docstring)."""

    def __init__(self, cfg: ArithmeticConfig | None = None) -> None:
        self.cfg = cfg or ArithmeticConfig()
        self.name = f"arithmetic-d{self.cfg.digits}m{self.cfg.mul_digits}-{''.join(self.cfg.ops)}"

    def _load_splits(self) -> dict[str, list[Problem]]:
        splits: dict[str, list[Problem]] = {"train": [], "eval": []}
        for p in _problems(self.cfg):
            splits["eval" if in_eval_split(p.prompt, self.cfg.eval_fraction) else "train"].append(p)
        return splits

    def reward(self, completion: str, answer: str) -> float:
        return exact_int_match(completion, answer)
