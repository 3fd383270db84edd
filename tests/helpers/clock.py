"""A clock a test sets by hand (`clock.t = ...`), for code that takes `clock: Callable[[], float]`."""

from __future__ import annotations


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
