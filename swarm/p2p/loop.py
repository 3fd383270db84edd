"""The bridge from blocking code to hivemind's asyncio: one event loop in a background thread.

hivemind is asyncio; the roles are plain blocking code. They hand coroutines to this loop and wait
for them, always with a timeout (a peer that never answers must not hold a thread forever).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from typing import Awaitable, Callable, TypeVar

log = logging.getLogger(__package__)  # the package's one logger: its lines read as before the split

T = TypeVar("T")
_END = object()


class CallStopped(Exception):
    """A call given up because the caller is stopping (`SwarmNode.call`'s `stop`)."""


class SwarmLoop:
    """An asyncio loop running in its own daemon thread, and blocking ways to run coroutines on it."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="swarm-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float) -> T:
        """Run a coroutine on the swarm loop and wait for it, at most `timeout` seconds."""
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop).result(timeout + 1)

    def run_until(self, coro: Awaitable[T], timeout: float, stop: threading.Event) -> T:
        """As `run`, but given up (the call cancelled) as soon as `stop` is set."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop)
        deadline = time.monotonic() + timeout + 1
        while not stop.is_set():
            try:
                return future.result(min(0.2, max(deadline - time.monotonic(), 0)))
            except concurrent.futures.TimeoutError:
                if time.monotonic() >= deadline:
                    future.cancel()
                    raise TimeoutError(f"no reply in {timeout:.1f} s") from None
        future.cancel()
        raise CallStopped("stopped while waiting for a reply")

    def run_feeding(self, coro: Awaitable[T], timeout: float, items: queue.SimpleQueue,
                    on_item: Callable) -> T:
        """As `run`, calling `on_item` here for each item the coroutine puts in `items` meanwhile."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop)
        future.add_done_callback(lambda _: items.put(_END))
        deadline = time.monotonic() + timeout + 1
        try:
            while (item := items.get(timeout=max(deadline - time.monotonic(), 0))) is not _END:
                on_item(item)
        except queue.Empty:  # wait_for ends the call at `timeout`: only a stuck loop gets here
            raise TimeoutError(f"no end of stream in {timeout:.1f} s") from None
        finally:
            future.cancel()  # if on_item raised: stop reading (a no-op once done)
        return future.result(0)

    def close(self, timeout: float) -> None:
        """End the calls still running (their callers' threads wait on them; process exit joins
        those), then stop the loop and its thread."""
        try:
            # not self.run: its wait_for task would be one of the "others" and cancel this very call
            asyncio.run_coroutine_threadsafe(_cancel_others(timeout), self._loop).result(timeout + 1)
        except Exception as e:
            log.warning("cancelling calls at shutdown: %s", e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)


async def _cancel_others(timeout: float) -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in others:
        t.cancel()
    if others:
        await asyncio.wait(others, timeout=timeout)
