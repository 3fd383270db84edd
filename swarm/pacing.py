"""Periodic work a node's roles do beside their loop: pacing (`Every`), network work that survives
an exhausted resource (`survive`), and the announcement heartbeat (`Heartbeat`). Light (no torch):
the benchmarks that stand in for a role's sampler run the same heartbeat as `join`'s."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, TypeVar

log = logging.getLogger("hetero-node")
T = TypeVar("T")


class Every:
    """True once every `seconds` (the first call too): the pacing of periodic work in role loops."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self._last = seconds, float("-inf")

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


class Heartbeat:
    """A role's periodic DHT work (its announcement) on a thread of its own.

    At real size a learner's step or a sampler's generation batch takes minutes, and work paced
    by the role's loop ran only between them: a peer record of `peer_ttl_s` (30 s) expired
    mid-step, and samplers dropped a learner that was training for them ("gone from the swarm").
    Each job runs once every `every_s` (the first at once) through `survive`; a bug ends the
    thread and `check` raises it in the role's loop, as it would have been raised there before.
    A job reads only what the loop hands it whole (a dict it replaces, never mutates): the loop's
    own structures change under a second thread."""

    def __init__(self, jobs: list[tuple[str, float, Callable[[], object]]]) -> None:
        self._jobs = [(what, Every(every_s), work) for what, every_s, work in jobs]
        self._stop, self._error = threading.Event(), None
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for what, due, work in self._jobs:
                    if due():
                        survive(what, work)
                self._stop.wait(0.2)
        except Exception as e:  # a bug: the role's loop raises it (`check`)
            self._error = e

    def check(self) -> None:
        """Raise what ended the heartbeat, if anything did."""
        if self._error is not None:
            raise RuntimeError("the role's heartbeat (its DHT announcements) failed") from self._error

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


def survive(what: str, work: Callable[[], T]) -> T | None:
    """Run a role's periodic network work (announce, publish a tally, ask the DHT); a resource the
    process ran out of (EMFILE, ENOMEM, a socket error) is logged and the loop goes on: it is
    retried on its next turn. Bugs (anything else) still end the role."""
    try:
        return work()
    except (OSError, MemoryError) as e:
        log.warning("%s failed (%s: %s); trying again on the next turn", what, type(e).__name__, e)
        return None
