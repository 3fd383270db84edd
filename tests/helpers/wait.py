"""Waiting on a condition by polling it, not by a fixed sleep that a loaded or slow CPU outruns."""

from __future__ import annotations

import time
from typing import Callable


PATIENCE_S = 30.0
"""How long a test waits for what should happen at once (a reply, a close): a hang fails the test, a
slow or loaded CPU does not. A wait that must pass a deadline of the code under test is derived from
that deadline instead."""


def until(cond: Callable[[], object], what: str, timeout: float = PATIENCE_S, every: float = 0.01) -> None:
    """Return once `cond()` is true; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(every)
