"""Whether processes are still running, for the tests that stop them (zombies count as gone)."""

from __future__ import annotations

import time

from swarm.lifetime import proc_table


def alive(pids: set[int]) -> set[int]:
    live = {pid for pid, state, _, _ in proc_table() if state != "Z"}
    return pids & live


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """The pids still running after up to `timeout` seconds (polled every 0.2 s)."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)
