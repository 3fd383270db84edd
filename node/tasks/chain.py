"""A task in the regime the staleness papers study: long completions with a verifiable answer.

Prompts are sums of 2-digit numbers, ``"37+58+12+91="``; a completion works them out step by step
on a scratchpad, one partial sum per line, and ends with the answer after ``#``::

    37+58=95
    95+12=107
    107+91=198
    #198

With 4-8 terms (the default) a worked completion is 30-80 characters, i.e. tokens for the
character-level tiny models (the arithmetic task's completions are 1-4), so sequence-level ratios average over
tens of tokens, as they do for the hundreds-of-token completions of GEPO's and M2PO's runs. Only
the answer is verified (`final_answer_match`): the scratchpad is the policy's own business.

The problems are a fixed pool drawn from one seeded generator, identical on every peer; the
train/eval split is a hash of the problem text (disjoint by construction, as for arithmetic).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from node.tasks.base import Problem, SplitTask, in_eval_split

_ANSWER_RE = re.compile(r"#(-?\d+)\s*$")


@dataclass(frozen=True)
class ChainConfig:
    min_terms: int = 4
    max_terms: int = 8
    """Terms per sum, drawn uniformly: k terms make a scratchpad of k - 1 lines."""
    pool: int = 60_000
    """Problems generated (train and eval together); the pool is the same on every peer."""
    eval_fraction: float = 0.05

    def __post_init__(self) -> None:
        if not 2 <= self.min_terms <= self.max_terms <= 12:
            raise ValueError("chain: need 2 <= min_terms <= max_terms <= 12 (12 terms is ~130 tokens of scratchpad)")
        distinct = sum(90**k for k in range(self.min_terms, self.max_terms + 1))
        if not 100 <= self.pool <= min(1_000_000, distinct // 2):  # // 2: drawing the pool stays quick
            raise ValueError(f"chain: pool must be in [100, {min(1_000_000, distinct // 2)}] for "
                             f"{self.min_terms}-{self.max_terms} terms")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError("chain: eval_fraction must be in (0, 1)")


def scratchpad(terms: list[int]) -> str:
    """The worked completion for `terms`: one partial sum per line, then '#' and the answer."""
    lines, total = [], terms[0]
    for t in terms[1:]:
        lines.append(f"{total}+{t}={total + t}")
        total += t
    return "\n".join(lines) + f"\n#{total}"


def final_answer_match(completion: str, answer: str) -> float:
    """1.0 if the completion ends with '#' and exactly the integer `answer` (one '#' in all)."""
    m = _ANSWER_RE.search(completion)
    return 1.0 if m is not None and completion.count("#") == 1 and m.group(1) == answer.strip() else 0.0


class ChainTask(SplitTask):
    """Multi-term sums worked out on a scratchpad (see module docstring)."""

    def __init__(self, cfg: ChainConfig | None = None) -> None:
        self.cfg = cfg or ChainConfig()
        self.name = f"chain-t{self.cfg.min_terms}-{self.cfg.max_terms}"

    def _load_splits(self) -> dict[str, list[Problem]]:
        rng = random.Random(f"chain-v1:{self.cfg.min_terms}:{self.cfg.max_terms}")
        splits: dict[str, list[Problem]] = {"train": [], "eval": []}
        seen: set[str] = set()
        while len(seen) < self.cfg.pool:
            terms = [rng.randrange(10, 100) for _ in range(rng.randint(self.cfg.min_terms, self.cfg.max_terms))]
            text = "+".join(map(str, terms)) + "="
            if text in seen:
                continue
            seen.add(text)
            p = Problem(id=f"chain:{text[:-1]}", prompt=text, answer=str(sum(terms)))
            splits["eval" if in_eval_split(text, self.cfg.eval_fraction) else "train"].append(p)
        return splits

    def reward(self, completion: str, answer: str) -> float:
        return final_answer_match(completion, answer)

    @staticmethod
    def worked(problem: Problem) -> str:
        """The reference completion of `problem` (for supervised warm-up, examples/make_tiny_model.py)."""
        return scratchpad([int(t) for t in problem.prompt[:-1].split("+")])
