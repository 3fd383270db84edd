"""Custom rewards (`package.module:function`, as a user configures one) that cost a learner more
than any budget on some texts: tests/unit/node/test_reward_budget.py holds them to the same deadline
as math-verify. And two answers that cost math-verify itself seconds (TOWER, EVADES), for that test
and its twin over the wire, tests/integration/node/test_reward_budget_wire.py.

    sleepy     sleeps a minute on a text containing "slow" (Python code: the worker's timer stops it)
    stubborn   the same with SIGALRM blocked (as C code that checks no signal): only the kill stops it
    alarmist   sets its own 30 s alarm first, as a reward calling math-verify with its default
               timeouts would: that resets the worker's timer, and the kill stops it
    hungry     asks for 4 GiB on a text containing "big": past the worker's address space
Else each is an exact integer match.
"""

from __future__ import annotations

import signal
import time

TOWER = "\\boxed{9^{9^{9}}}"
"""5.3 s in math-verify on the main thread (its two 5 s timeouts), none off it: the review's case."""
EVADES = "\\boxed{(x+1)^{1000}}"
"""No pre-check catches it (an exponent of 1,000); math-verify spends over 3 s on it: the deadline's."""


def _exact(completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer.strip() else 0.0


def sleepy(completion: str, answer: str) -> float:
    if "slow" in completion:
        time.sleep(60)
    return _exact(completion, answer)


def stubborn(completion: str, answer: str) -> float:
    if "slow" in completion:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)
    return _exact(completion, answer)


def alarmist(completion: str, answer: str) -> float:
    if "slow" in completion:
        signal.alarm(30)
        time.sleep(60)
    return _exact(completion, answer)


def hungry(completion: str, answer: str) -> float:
    """Asks for 4 GiB on a text containing "big": past the worker's address space."""
    if "big" in completion:
        return float(len(bytearray(4 << 30)))
    return _exact(completion, answer)
