"""Pure reward functions: reward(completion_text, gold_answer) -> float in [0, 1].

Rewards are verifiable: a learner recomputes them from the completion text and never trusts the
reward a sampler claims. A custom reward is named by import path, `package.module:function`.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import math
import re
import threading
from contextlib import contextmanager
from typing import Callable

from node.tasks.base import RewardFn

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


SIGNAL_TIMEOUTS = True
"""Whether `math_verify_reward` uses math-verify's own 5 s timeouts (SIGALRM, on the main thread
only). A learner's reward worker (node/tasks/bounded.py) sets it False: its own timer bounds a
whole group, and math-verify's alarm would reset that timer."""


def math_verify_reward(completion: str, answer: str) -> float:
    """1.0 if math-verify finds the completion's final answer equal to `answer`.

    The completion's answer is its last \\boxed{...} when there is one, else the whole text (a
    plain final answer). Equivalent forms count: 1/2, 0.5, \\frac{1}{2}; 1,000 and 1000.
    Unparseable or timed-out comparisons give 0.0, never an exception, and so does an answer
    `math_verify_refusal` refuses (sympy would spend seconds or gigabytes on it).
    """
    if math_verify_refusal(completion) is not None:
        return 0.0
    from math_verify import parse, verify  # lazy: pulls in sympy

    boxed = _last_boxed(completion)
    pred_text = f"${boxed}$" if boxed is not None else completion
    gold_text = answer if "\\boxed" in answer or "$" in answer else f"${answer}$"
    # math-verify's timeouts use SIGALRM, which exists only on the main thread; elsewhere (a thread
    # of a sampler or an evaluation) run without one rather than crash. A learner never scores a
    # peer's text here: it uses a worker process with a deadline (node/tasks/bounded.py).
    timeout = 5 if SIGNAL_TIMEOUTS and threading.current_thread() is threading.main_thread() else None
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


# ---- what math-verify is never asked: answers whose cost grows without bound -------------------------
# Each bound sits far above honest final answers (examples/bench_reward_budget.py: 5,000 of MATH's and
# GSM8K's forms pass every one) and below what costs a group's budget (node/tasks/bounded.py; times
# of one completion in math-verify, measured on this 2-core CPU, without its timeouts):
MAX_ANSWER_CHARS = 1000
"""Characters of a boxed answer (honest ones: a few to ~150). 3,000 terms of a sum took 0.53 s."""
MAX_NESTING = 8
"""Depth of (), [], {} in the answer (honest: <= 4). Braces 10 deep took 0.9 s, 12 deep 1.6 s, 20
deep over 4 s (sympy's parse of nested groups is exponential in their depth)."""
MAX_EXPONENT = 10**4
"""An exponent's magnitude, whatever the base (honest: 2^{2016} and the like). 9^{9^{9}} ran 5 s
into math-verify's timeout, 2^{-10^9}, (1/3)^{10^8} and (x+1)^{100000} past 3 s, and the last grew
the process by 520 MB; (x+1)^{1000} takes 3 s too, which only the worker's deadline stops."""
MAX_POWER_BITS = 1 << 20
"""Bits of a power of a number (7^{3,000,000}, 8.4M bits: 0.8 s)."""
MAX_FACTORIAL = 10**4
"""n of n! and of \\binom{n}{k} (10^6! past 3 s; 300,000!: 0.47 s; \\binom{10^5}{5 10^4}: 0.44 s)."""

_NUMERIC_RE = re.compile(r"^[\d\s{}()\[\]^*.,+-]*$")
_POWER_RE = re.compile(r"\^|\*\*")
_NUMBER_RE = re.compile(r"[+-]?\s*\d+(\.\d+)?")
_FACTORIAL_RE = re.compile(r"(?<![\d.])(\d+(\.\d+)?|[})\]])\s*!")  # from a number's first digit: linear
_BINOM_RE = re.compile(r"\\[dt]?binom\s*\{|\\choose")
_OPEN, _CLOSE = "({[", ")}]"
_SCAN = 64
"""Characters an operand of a power or factorial is looked for in, each way: a longer one is no
tower of numbers this check sizes (9^{9^{9}} is 9), and each look stays short."""
_MAX_LOOKS = 256
"""Powers, factorials and binomials looked at in one answer, the first ones: past them the check
says nothing more (the worker's deadline still holds), so it costs at most a few ms, whatever the
text (64,000 characters of carets: 0.1 s when every one was looked at)."""


def _group_end(text: str, i: int, limit: int) -> int:
    """The index past the balanced group opening at text[i], or -1 if it does not close before
    `limit`."""
    depth = 0
    for j in range(i, min(len(text), limit)):
        if text[j] in _OPEN:
            depth += 1
        elif text[j] in _CLOSE:
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def _operand_after(text: str, i: int, limit: int | None = None) -> str:
    """The operand starting at text[i] (blanks skipped): a balanced group, else a signed number or
    one character, with any powers chained to it (9**9**9 is 9**(9**9)); '' if none before `limit`
    (`_SCAN` characters on)."""
    limit = min(len(text), i + _SCAN if limit is None else limit)
    while i < limit and text[i].isspace():
        i += 1
    if i >= limit:
        return ""
    if text[i] in _OPEN:
        end = _group_end(text, i, limit)
        return text[i:end] if end > 0 else ""
    m = _NUMBER_RE.match(text, i, limit)
    if m is None:
        return text[i]
    j = m.end()
    while j < limit and text[j].isspace():
        j += 1
    chained = _POWER_RE.match(text, j, limit)
    rest = _operand_after(text, chained.end(), limit) if chained else ""  # at most _SCAN / 2 deep
    return text[i:chained.end()] + rest if rest else m.group(0)


def _operand_before(text: str, i: int) -> str:
    """The operand ending just before text[i]: a balanced group, else a number, else ''; looked for
    within `_SCAN` characters."""
    j = i
    while j > 0 and text[j - 1].isspace():
        j -= 1
    stop = max(0, j - _SCAN)
    if j > 0 and text[j - 1] in _CLOSE:
        depth = 0
        for k in range(j - 1, stop - 1, -1):
            depth += (text[k] in _CLOSE) - (text[k] in _OPEN)
            if depth == 0:
                return text[k:j]
        return ""
    k = j
    while k > stop and (text[k - 1].isdigit() or text[k - 1] == "."):
        k -= 1
    return text[k:j]


def _split_top(s: str, seps: str) -> list[str]:
    """`s` cut at each of the characters `seps` outside groups; a sign right after an operator or at
    the start is unary, not a cut, and so is a '*' of '**'."""
    if not any(c in s for c in seps):
        return [s]
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(s):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0 and ch in seps:
            before = s[start:k].rstrip()
            if not before or before[-1] in "^*+-" or s[k + 1:k + 2] == "*":
                continue  # unary, or a '**'
            parts.append(s[start:k])
            start = k + 1
    parts.append(s[start:])
    return parts


def _log2_size(s: str) -> float | None:
    """An upper bound on log2 |value| of `s` if it is numbers under sums, products, powers and
    groups, else None: 9^{9^{9}} gives 387,420,489 log2(9); past a float's range, inf."""
    s = s.replace("\\left", "").replace("\\right", "").replace("\\cdot", "*").replace("\\times", "*").strip()
    while len(s) >= 2 and s[0] in _OPEN and _group_end(s, 0, len(s)) == len(s):
        s = s[1:-1].strip()
    if not s or not _NUMERIC_RE.match(s):
        return None
    for seps, combine in (("+-", lambda xs: max(xs) + 1), ("*", sum)):
        parts = _split_top(s, seps)
        if len(parts) > 1:
            sizes = [_log2_size(x) for x in parts]
            return None if None in sizes else combine([max(x, 0.0) for x in sizes])
    s = s.lstrip("+- ")
    depth, power = 0, None
    for k, ch in enumerate(s):  # the first power outside groups: a^b^c is a^(b^c)
        depth += (ch in _OPEN) - (ch in _CLOSE)
        if depth == 0 and (ch == "^" or s.startswith("**", k)):
            power = k
            break
    if power is None:
        try:
            v = abs(float(s.replace(",", "").replace(" ", "")))
        except ValueError:
            return None
        return math.log2(v) if v > 0 else -math.inf
    base = _log2_size(s[:power])
    exp = _log2_size(s[power + (2 if s.startswith("**", power) else 1):])
    if base is None or exp is None:
        return None
    if base == -math.inf or base == 0:
        return base  # 0^x, 1^x
    return math.inf if exp > 1000 else abs(base) * 2.0 ** exp


def math_verify_refusal(completion: str) -> str | None:
    """Why math-verify is not to be asked about `completion`'s answer (the bounds above), or None.

    Cheap: one pass over the answer and a look at each power and factorial, microseconds. Not a
    bound by itself (sympy has more slow paths than any list: (x+1)^{1000} and integrals take
    seconds too); a learner's hard bound is its worker's deadline (node/tasks/bounded.py). This
    refuses up front what is known to exceed it, so those cost neither the budget nor a worker."""
    boxed = _last_boxed(completion)
    if boxed is not None and len(boxed) > MAX_ANSWER_CHARS:
        return f"a boxed answer of {len(boxed)} characters (at most {MAX_ANSWER_CHARS})"
    text = boxed if boxed is not None else completion
    depth = deepest = 0
    for ch in text:
        if ch in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
    if deepest > MAX_NESTING:
        return f"groups nested {deepest} deep (at most {MAX_NESTING})"
    looks = itertools.islice(itertools.chain(
        (("power", m) for m in _POWER_RE.finditer(text)), (("factorial", m) for m in _FACTORIAL_RE.finditer(text)),
        (("binomial", m) for m in _BINOM_RE.finditer(text))), _MAX_LOOKS)
    for kind, m in looks:
        why = _look(text, kind, m)
        if why is not None:
            return why
    return None


def _look(text: str, kind: str, m: re.Match) -> str | None:
    """Why the power, factorial or binomial `m` of `text` is refused, or None."""
    if kind == "power":
        exp = _log2_size(_operand_after(text, m.end()))
        if exp is None:
            return None
        if exp > math.log2(MAX_EXPONENT):
            return f"an exponent of about 2^{exp:.0f} (at most {MAX_EXPONENT})"
        base = _log2_size(_operand_before(text, m.start()))
        if base is not None and base != -math.inf and abs(base) * 2.0 ** exp > MAX_POWER_BITS:
            return f"a power of about 2^{abs(base) * 2.0 ** exp:.0f} (at most 2^{MAX_POWER_BITS})"
        return None
    if kind == "factorial":
        n = _log2_size(m.group(1) if m.group(1)[0].isdigit() else _operand_before(text, m.start(1) + 1))
    else:
        brace = text[m.end() - 1] == "{"
        n = _log2_size(_operand_after(text, m.end() - 1) if brace else _operand_before(text, m.start()))
    if n is not None and n > math.log2(MAX_FACTORIAL):
        return f"a {kind} of about 2^{n:.0f} (at most {MAX_FACTORIAL})"
    return None


PRECHECKS: dict[RewardFn, Callable[[str], str | None]] = {}
"""Reward -> its pre-check: why a completion is not to be scored at all (it would cost more than a
learner's budget), or None. A learner drops a group any completion of which it refuses."""


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


PRECHECKS[math_verify_reward] = math_verify_refusal
