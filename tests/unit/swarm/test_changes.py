"""`Changes`: a notify from another thread wakes the waiters in the loop, once per change."""

import asyncio
import threading

from swarm.p2p.changes import Changes


def test_a_notify_before_any_wait_is_dropped_and_the_first_wait_returns_at_once():
    changes = Changes()
    changes.notify()  # no loop known yet: nothing to wake, nothing raised

    async def main():
        # the first wait cannot know whether a change came since its caller looked: it says "look again"
        return await changes.wait(60.0)

    assert asyncio.run(main()) is True


def test_a_notify_from_another_thread_wakes_every_waiter_once():
    changes = Changes()

    async def main():
        await changes.wait(60.0)  # the first: returns at once, the loop is known from here on
        waiters = [asyncio.create_task(changes.wait(60.0)) for _ in range(3)]
        await asyncio.sleep(0)  # each is waiting now
        notifier = threading.Thread(target=changes.notify)
        notifier.start()
        woken = await asyncio.gather(*waiters)
        notifier.join()
        # the event is replaced at each change: a wait after it waits for the next one
        after = await changes.wait(0.01)
        return woken, after

    woken, after = asyncio.run(main())
    assert woken == [True, True, True] and after is False


def test_a_wait_that_times_out_says_so_and_a_zero_timeout_does_not_wait():
    changes = Changes()

    async def main():
        await changes.wait(60.0)
        return await changes.wait(0.01), await changes.wait(0.0), await changes.wait(-1.0)

    assert asyncio.run(main()) == (False, False, False)


def test_a_new_loop_starts_over_and_a_notify_after_its_loop_closed_is_harmless():
    changes = Changes()

    async def first():
        await changes.wait(60.0)
        return await changes.wait(0.01)

    assert asyncio.run(first()) is False
    changes.notify()  # its loop is closed: nobody waits, nothing raised

    async def second():  # another loop (a node restarted in the same process): looks again first
        return await changes.wait(60.0)

    assert asyncio.run(second()) is True
