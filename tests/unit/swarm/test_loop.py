"""The bridge from blocking code to the swarm's asyncio loop (swarm/p2p/loop.py): its watcher,
which tells a node that its loop was blocked (its peers' calls waited meanwhile)."""

from __future__ import annotations

import time


def test_the_loops_watcher_counts_a_blocked_loop_and_says_so(caplog):
    """A callback that holds the swarm loop 2.3 s: the watcher's next wake is that late, counted
    past every bound and logged; an idle loop is counted late past none."""
    from swarm.p2p.loop import TICK_S, SwarmLoop

    loop = SwarmLoop()
    try:
        time.sleep(1.0)
        idle = loop.lag()
        loop._loop.call_soon_threadsafe(time.sleep, 2.3)
        deadline = time.monotonic() + 10
        while loop.lag()["late_2s"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        lag = loop.lag()
    finally:
        loop.close(5.0)
    assert idle["late_2s"] == 0
    # the watcher's wake was due at most TICK_S after the block began, and came after it ended: at
    # least 2.3 - TICK_S = 2.05 s late, past every bound (a busy CPU only makes it later)
    assert lag["late_0.1s"] >= 1 and lag["late_0.5s"] >= 1 and lag["late_2s"] >= 1 and lag["max_s"] >= 2.3 - TICK_S
    assert any("swarm loop was blocked for 2." in r.getMessage() for r in caplog.records)
