"""A role's periodic work (swarm/pacing.py): an exhausted resource is logged and retried on the next
beat; a bug ends the heartbeat and the role's loop raises it."""

import threading
import time

import pytest

from swarm.pacing import Heartbeat, survive


def wait_until(done, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done()


def test_survive_returns_the_work_or_none_on_an_exhausted_resource_and_lets_bugs_through():
    assert survive("x", lambda: 3) == 3
    assert survive("x", lambda: (_ for _ in ()).throw(OSError(24, "Too many open files"))) is None
    assert survive("x", lambda: (_ for _ in ()).throw(MemoryError())) is None
    with pytest.raises(ValueError):
        survive("x", lambda: (_ for _ in ()).throw(ValueError("a bug")))


def test_a_heartbeat_retries_past_an_exhausted_resource_and_raises_a_bug_in_the_loop():
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(24, "Too many open files")

    beat = Heartbeat([("announcing", 0.01, flaky)])
    try:
        wait_until(lambda: len(calls) >= 3)  # the first failure was survived, the job ran again
        beat.check()  # nothing to raise
    finally:
        beat.close()
    ran = threading.Event()

    def buggy() -> None:
        ran.set()
        raise KeyError("a bug")

    beat = Heartbeat([("announcing", 0.01, buggy)])
    try:
        wait_until(ran.is_set)
        wait_until(lambda: not beat._thread.is_alive())
        with pytest.raises(RuntimeError, match="heartbeat") as e:
            beat.check()
        assert isinstance(e.value.__cause__, KeyError)
    finally:
        beat.close()
