"""Pure reward functions: reward(completion_text, gold_answer) -> float in [0, 1].

Rewards are verifiable: a learner recomputes them from the completion text and never trusts the
reward a sampler claims. A custom reward is named by import path, `package.module:function`.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from contextlib import contextmanager

from .base import RewardFn

log = logging.getLogger(__name__)

_INT_RE = re.compile(r"^\s*(-?\d+)\s*$")


def exact_int_match(completion: str, answer: str) -> float:
    """1.0 if the completion is exactly the integer `answer` (surrounding blanks allowed).

    Strict on purpose: "12" is right for 12, but "012", "12.0", "12 13" and "1 2" are wrong, so
    a policy cannot be rewarded for hedging or padding.
    """
    m = _INT_RE.match(completion)
    return 1.0 if m is not None and m.group(1) == answer.strip() else 0.0


_BOXED_RE = re.compile(r"\\boxed\s*\{")


def _last_boxed(text: str) -> str | None:
    """Content of the last balanced \\boxed{...} in `text`, or None."""
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    if not starts:
        return None
    i = start = starts[-1]
    depth = 1
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
        i += 1
    return None


@contextmanager
def _quiet_math_verify():
    """math-verify warns on every call made without a timeout; once is enough for us."""
    mv_log = logging.getLogger("math_verify")
    level = mv_log.level
    mv_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        mv_log.setLevel(level)


def math_verify_reward(completion: str, answer: str) -> float:
    """1.0 if math-verify finds the completion's final answer equal to `answer`.

    The completion's answer is its last \\boxed{...} when there is one, else the whole text (a
    plain final answer). Equivalent forms count: 1/2, 0.5, \\frac{1}{2}; 1,000 and 1000.
    Unparseable or timed-out comparisons give 0.0, never an exception.
    """
    from math_verify import parse, verify  # lazy: pulls in sympy

    boxed = _last_boxed(completion)
    pred_text = f"${boxed}$" if boxed is not None else completion
    gold_text = answer if "\\boxed" in answer or "$" in answer else f"${answer}$"
    # math-verify's timeouts use SIGALRM, which exists only on the main thread; elsewhere
    # (a reward worker thread) run without one rather than crash.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        with _quiet_math_verify():
            gold = parse(gold_text, parsing_timeout=timeout)
            pred = parse(pred_text, parsing_timeout=timeout)
            if not gold or not pred:
                return 0.0
            return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0
    except Exception as e:  # math-verify raises on pathological LaTeX; a reward must not
        log.debug("math_verify failed on %r vs %r: %s", completion[:80], answer, e)
        return 0.0


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "exact_int": exact_int_match,
    "math_verify": math_verify_reward,
}


def load_reward(name: str) -> RewardFn:
    """A built-in reward by name, or any function by import path `pkg.module:function`."""
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if ":" not in name:
        raise ValueError(
            f"unknown reward {name!r}: use one of {sorted(BUILTIN_REWARDS)} "
            "or an import path like 'my_pkg.rewards:score'"
        )
    module_name, attr = name.split(":", 1)
    fn = getattr(importlib.import_module(module_name), attr, None)
    if not callable(fn):
        raise ValueError(f"reward {name!r}: {module_name} has no callable {attr!r}")
    return fn
