"""The leaderboard's page server holds what it declares (swarm/leaderboard/server.py, `ServerLimits`):
real sockets on 127.0.0.1 against an in-process server, no mocks.

Past the connection cap a new connection takes the place of the oldest idle one, and gets a 503
when every connection is answering; a render stuck on the store does not stop the loop; 50 clients
that reset their connection before their answer cost one log line each, no traceback; a client that
stops reading is cut at its send deadline. The loads (1,500 half-sent requests, 200 clients at once):
tests/integration/swarm/test_leaderboard_server_load.py.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time

from helpers.leaderboard import HALF_SENT, closed_by_server, connect, get, history_store
from swarm.leaderboard import LeaderboardServer, LeaderboardStore, ServerLimits
from helpers.wait import PATIENCE_S, until


@contextlib.contextmanager
def _stuck(store: LeaderboardStore):
    """Every render waits while this holds the store's lock, as behind a long write by the collector."""
    with store._lock:  # noqa: SLF001 (the real lock: a real stall, no fake store)
        yield


def test_past_the_cap_a_connection_takes_an_idle_ones_place_or_gets_a_503_and_a_stuck_render_blocks_no_one(tmp_path):
    store = history_store(tmp_path / "lb.db")
    # half-sent requests are closed at request_s anyway: far past the waits below, so that only an
    # eviction closes one within them
    limits = ServerLimits(max_connections=4, request_s=3 * PATIENCE_S, idle_s=3 * PATIENCE_S)
    with LeaderboardServer(store, "demo", "127.0.0.1", 0, limits=limits) as server:
        idle = [connect(server.address, HALF_SENT) for _ in range(4)]
        until(lambda: len(server._door._live) == 4, "4 connections open")
        assert get(server.url)[0] == 200  # a fifth connection: the oldest idle one made room
        assert closed_by_server(idle[0], PATIENCE_S) and not closed_by_server(idle[1], 0.2)
        until(lambda: not server._door._busy, "the first answer done")  # it leaves the set after its reply
        with _stuck(store):
            busy = []
            for _ in range(4):  # each evicts a half-sent one, then waits on the store
                busy.append(connect(server.address, b"GET /rows HTTP/1.1\r\nHost: x\r\n\r\n"))
                until(lambda: len(server._door._busy) == len(busy), f"{len(busy)} answering")
            assert all(closed_by_server(s, PATIENCE_S) for s in idle[1:])
            extra = connect(server.address, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            extra.settimeout(PATIENCE_S)
            assert extra.recv(100).startswith(b"HTTP/1.1 503 "), "every connection answers: the next one is refused"
            assert closed_by_server(extra, PATIENCE_S)
        for s in busy:  # the store is free again: the four waiting answers go out
            s.settimeout(PATIENCE_S)
            assert s.recv(100).startswith(b"HTTP/1.1 200 ")
        with _stuck(store):  # a render stuck on the store delays only what needs the store
            s = connect(server.address, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(PATIENCE_S)  # the store stays stuck meanwhile: an answer at all is the point
            assert s.recv(100).startswith(b"HTTP/1.1 404 ")
        for s in idle + busy + [extra, s]:
            s.close()


def test_clients_that_reset_before_their_answer_cost_one_log_line_each_and_no_traceback(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    store = history_store(tmp_path / "lb.db")
    with LeaderboardServer(store, "demo", "127.0.0.1", 0) as server:
        with _stuck(store):  # every request waits on the store, so each reset finds its answer pending
            clients = [connect(server.address, b"GET /api/history HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(50)]
            until(lambda: len(server._door._busy) == 50, "50 requests answering")
            caplog.clear()
            for c in clients:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
                c.close()
            until(lambda: sum("went away" in r.getMessage() for r in caplog.records) >= 50, "50 'went away' lines")
            time.sleep(0.2)  # and a moment for any further line they would cost (counted below: none)
        assert get(server.url + "api/history")[0] == 200  # and it serves on
    served = [r for r in caplog.records if r.name.startswith(("swarm.leaderboard", "aiohttp", "asyncio"))]
    gone = [r for r in served if "went away" in r.getMessage()]
    print(f"\n{len(served)} log lines for 50 reset clients and one normal one, {len(gone)} of them 'went away'")
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in served), caplog.text
    assert len(gone) == 50 and all("127.0.0.1" in r.getMessage() for r in gone), caplog.text
    assert len(served) <= 51 and not any("\n" in r.getMessage() for r in served), caplog.text


def test_a_client_that_stops_reading_is_cut_at_its_send_deadline(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="swarm.leaderboard")
    store = history_store(tmp_path / "lb.db", peers=300, tallies=50)  # /api/history: ~230 KB
    limits = ServerLimits(send_base_s=1.0, min_send_rate=1 << 30, send_buffer=16 * 1024)  # its deadline: ~1 s
    with LeaderboardServer(store, "demo", "127.0.0.1", 0, limits=limits) as server:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes nothing
        s.connect(server.address)
        s.sendall(b"GET /api/history HTTP/1.1\r\nHost: x\r\n\r\n")
        # it reads nothing until the server says it cut it (reading first could let the answer out)
        until(lambda: any(" cut: " in r.getMessage() for r in caplog.records), "the reader cut")
        assert closed_by_server(s, PATIENCE_S)
        s.close()
    assert [r.getMessage() for r in caplog.records if "cut" in r.getMessage()] == [
        "leaderboard: 127.0.0.1 cut: its answer to /api/history was not out in 1 s"], caplog.text
