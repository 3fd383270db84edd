"""`Changes`: wakes the node's handlers when state that another thread changes has changed.

Weight stores, the learner's publications and relayed tails are written by plain threads (the
fetcher's pool, the learner) and read by handlers waiting in the node's event loop. A handler that
polled would wake ~100 times a second for each request it holds; one `asyncio.Event`, replaced at
each change and set from the writer's thread with `call_soon_threadsafe`, wakes it once per change.
"""

from __future__ import annotations

import asyncio


class Changes:
    """One writer-side `notify()` (any thread) wakes every `wait()` (the node's loop) under way.

    Callers look at the state, then wait, then look again: a change is made before `notify` is
    called, so a handler that looked too early is woken after it. `wait` never tells what changed.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def notify(self) -> None:
        """The state changed: wake the waiters (from any thread; nothing to do before the first wait)."""
        loop = self._loop
        if loop is not None and loop.is_running():  # (a stopped loop: the node is shutting down, nobody waits)
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # closed meanwhile
                pass

    def _wake(self) -> None:  # in the loop
        if self._event is not None:
            self._event.set()
            self._event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """Until the next change, at most `timeout` s: False if the time ran out first.

        The first wait in a loop returns True at once: a change made after the caller looked woke
        no one (no loop was known yet), so the caller looks again; from then on every change wakes it.
        """
        loop = asyncio.get_running_loop()
        if self._event is None or self._loop is not loop:
            self._loop, self._event = loop, asyncio.Event()
            return True
        if timeout <= 0:
            return False
        try:  # (asyncio.timeout, not wait_for: no task per wait, and 3.11's wait_for may swallow a cancel)
            async with asyncio.timeout(timeout):
                await self._event.wait()
            return True
        except TimeoutError:
            return False
