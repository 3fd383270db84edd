"""Waiting on a condition by polling it, not by a fixed sleep that a loaded or slow CPU outruns."""

from __future__ import annotations

import time
from typing import Callable


def until(cond: Callable[[], object], what: str, timeout: float = 30.0, every: float = 0.01) -> None:
    """Return once `cond()` is true; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(every)
