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

TICK_S = 0.25
"""How often the loop's watcher wakes: the resolution of `SwarmLoop.lag`."""
LATE_S = (0.1, 0.5, 2.0)
"""The lateness `SwarmLoop.lag` counts wakes past; past the last one a stall is also logged (the
1st, 10th and 100th such, and any over 10 times it)."""


class CallStopped(Exception):
    """A call given up because the caller is stopping (`SwarmNode.call`'s `stop`)."""


class SwarmLoop:
    """An asyncio loop running in its own daemon thread, and blocking ways to run coroutines on it."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="swarm-loop", daemon=True)
        self._thread.start()
        self._late = dict.fromkeys(LATE_S, 0)
        self._late_max = 0.0
        asyncio.run_coroutine_threadsafe(self._watch(), self._loop).add_done_callback(_said_if_failed)

    async def _watch(self) -> None:
        """How late the loop runs what is due. While it is blocked (a callback that does not yield,
        the GIL held elsewhere), no call of ours or of any peer to us makes progress, and a read's
        timeout that fell due meanwhile fires before the data that came with it is read."""
        while True:
            t = time.monotonic()
            await asyncio.sleep(TICK_S)
            late = time.monotonic() - t - TICK_S
            self._late_max = max(self._late_max, late)
            for bound in LATE_S:
                self._late[bound] += late > bound
            if late > LATE_S[-1] and self._late[LATE_S[-1]] in (1, 10, 100) or late > 10 * LATE_S[-1]:
                log.warning("the swarm loop was blocked for %.1f s: calls to and from peers waited (%d such stalls)",
                            late, self._late[LATE_S[-1]])

    def lag(self) -> dict[str, float]:
        """Counts of the watcher's wakes later than each of `LATE_S` and the latest one (s), since
        the start (cumulative, for plots)."""
        return {**{f"late_{bound:g}s": n for bound, n in self._late.items()}, "max_s": round(self._late_max, 3)}

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


def _said_if_failed(future: concurrent.futures.Future) -> None:
    """The watcher ends only when cancelled (`close`): anything else is logged, its counts frozen."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("the swarm loop's watcher stopped: %r", future.exception())


async def _cancel_others(timeout: float) -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in others:
        t.cancel()
    if others:
        await asyncio.wait(others, timeout=timeout)
