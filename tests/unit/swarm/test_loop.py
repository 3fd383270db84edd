"""The bridge from blocking code to the swarm's asyncio loop (swarm/p2p/loop.py): its watcher,
which tells a node that its loop was blocked (its peers' calls waited meanwhile)."""

from __future__ import annotations

import re
import time

from helpers.wait import until


def test_the_loops_watcher_counts_a_blocked_loop_and_says_so(caplog):
    """A callback that holds the swarm loop 2.3 s: the watcher's next wake is that late, counted
    past every bound and logged; an idle loop is counted late past none."""
    from swarm.p2p.loop import LATE_S, TICK_S, SwarmLoop

    loop = SwarmLoop()
    try:
        time.sleep(1.0)
        idle = loop.lag()
        loop._loop.call_soon_threadsafe(time.sleep, 2.3)
        until(lambda: loop.lag()["late_2s"], "the blocked loop counted", every=0.1)
        lag = loop.lag()
    finally:
        loop.close(5.0)
    assert idle["late_2s"] == 0
    # the watcher's wake was due at most TICK_S after the block began, and came after it ended: at
    # least 2.3 - TICK_S = 2.05 s late, past every bound (a busy CPU only makes it later)
    assert lag["late_2s"] >= 1 and lag["max_s"] >= 2.3 - TICK_S
    assert lag["late_0.1s"] >= lag["late_0.5s"] >= lag["late_2s"]  # a wake past a bound is past every lower one
    said = [float(m.group(1)) for r in caplog.records if (m := re.search(r"swarm loop was blocked for ([\d.]+) s", r.getMessage()))]
    assert said and said[0] >= LATE_S[-1], said  # logged once past the last bound (its %.1f of >= 2.05 s)
