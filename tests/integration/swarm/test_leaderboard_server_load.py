"""The leaderboard's page server under load (swarm/leaderboard/server.py, `ServerLimits`): real
sockets on 127.0.0.1 against an in-process server, no mocks. 1,500 half-sent requests (the attack
that made the stdlib server 1,505 threads) hold no threads, do not keep a normal client out, and are
closed at the request deadline; 200 clients at once on /api/history are all answered (latencies
printed). Its limits one by one: tests/unit/swarm/test_leaderboard_server.py.
"""

from __future__ import annotations

import resource
import statistics
import threading
import time

import pytest

from helpers.leaderboard import HALF_SENT, closed_by_server, connect, get, history_store
from swarm.leaderboard import LeaderboardServer, ServerLimits


def _server_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("leaderboard")]


@pytest.fixture
def many_files():
    """The process's descriptor limit raised to its hard limit for the test, and put back after (a
    later test in this process sees the limit it would see alone)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        assert hard >= 4000, "1,500 sockets on both ends need 4,000 descriptors"
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_1500_half_sent_requests_hold_no_threads_keep_no_one_out_and_are_closed_at_the_deadline(tmp_path, many_files):
    store = history_store(tmp_path / "lb.db")
    limits = ServerLimits(request_s=8.0)
    with LeaderboardServer(store, "demo", "127.0.0.1", 0, limits=limits) as server:
        start = time.monotonic()
        idle = [connect(server.address, HALF_SENT) for _ in range(1500)]
        opened = time.monotonic() - start
        threads, mine = threading.active_count(), _server_threads()
        t = time.monotonic()
        status, _ = get(server.url)
        answered = time.monotonic() - t
        still = [s for s in idle if not closed_by_server(s, 0.001)]
        print(f"\n1,500 half-sent requests opened in {opened:.1f} s; a normal GET / answered in {answered:.3f} s; "
              f"{threading.active_count()} threads in this process ({len(mine)} the server's: {mine}); "
              f"{len(still)} of them still open (the cap is {limits.max_connections})")
        assert status == 200 and answered < 5
        assert threads < 50 and len(mine) <= 1 + limits.render_threads
        assert len(still) <= limits.max_connections  # the rest made room for newer ones
        assert opened < limits.request_s - 1, "opening took so long the deadline check below proves little"
        t = time.monotonic()
        late = [s for s in still if not closed_by_server(s, max(0.1, start + limits.request_s + 5 - time.monotonic()))]
        print(f"the {len(still)} left were closed {time.monotonic() - start:.1f} s after the first was opened")
        assert not late, f"{len(late)} half-sent requests outlived the {limits.request_s} s deadline"
        for s in idle:
            s.close()


def test_200_clients_at_once_on_the_history_are_all_answered(tmp_path, many_files):
    store = history_store(tmp_path / "lb.db", peers=50, tallies=40)
    with LeaderboardServer(store, "demo", "127.0.0.1", 0) as server:
        url, go, took, codes = server.url + "api/history", threading.Barrier(200), [], []

        def client() -> None:
            go.wait()
            t = time.monotonic()
            codes.append(get(url, timeout=60)[0])
            took.append(time.monotonic() - t)

        clients = [threading.Thread(target=client) for _ in range(200)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(90)
        took.sort()
        print(f"\n200 clients on /api/history ({len(get(url)[1]):,} bytes): p50 {statistics.median(took):.3f} s, "
              f"p99 {took[int(0.99 * len(took)) - 1]:.3f} s, max {took[-1]:.3f} s")
        assert codes == [200] * 200
