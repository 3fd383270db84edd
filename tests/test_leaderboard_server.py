"""The leaderboard's page server holds what it declares (swarm/leaderboard/server.py, `ServerLimits`):
real sockets on 127.0.0.1 against an in-process server, no mocks.

Unit (fast): past the connection cap a new connection takes the place of the oldest idle one, and
gets a 503 when every connection is answering; a render stuck on the store does not stop the loop;
50 clients that reset their connection before their answer cost one log line each, no traceback;
a client that stops reading is cut at its send deadline.
Integration: 1,500 half-sent requests (the attack that made the stdlib server 1,505 threads) hold
no threads, do not keep a normal client out, and are closed at the request deadline; 200 clients
at once on /api/history are all answered (latencies printed).
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import statistics
import struct
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from swarm.leaderboard import LeaderboardServer, LeaderboardStore, ServerLimits

HALF_SENT = b"GET / HTTP/1.1\r\nHost: x\r\n"  # no blank line: the head never ends


def _store(path: Path, peers: int = 20, tallies: int = 20) -> LeaderboardStore:
    """A store whose history has peers x tallies points (/api/history grows with both)."""
    store = LeaderboardStore(path)
    for seq in range(1, tallies + 1):
        store.ingest({"learner": "L1", "seq": seq, "time": 1000.0 + seq, "model_id": "m",
                      "peers": {f"P{i:04d}": {"groups": seq, "rollouts": 4 * seq, "tokens": 40 * seq, "first": 999.0,
                                              "last": 1000.0 + seq, "models": ["m"]} for i in range(peers)}})
    return store


def _get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _connect(address: tuple[str, int], send: bytes = b"") -> socket.socket:
    s = socket.create_connection(address, timeout=30)
    if send:
        s.sendall(send)
    return s


def _closed_by_server(s: socket.socket, within: float) -> bool:
    """Whether the server closes `s` within `within` s (any bytes it sends first are read and skipped)."""
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def _server_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("leaderboard")]


@contextlib.contextmanager
def _stuck(store: LeaderboardStore):
    """Every render waits while this holds the store's lock, as behind a long write by the collector."""
    with store._lock:  # noqa: SLF001 (the real lock: a real stall, no fake store)
        yield


def test_past_the_cap_a_connection_takes_an_idle_ones_place_or_gets_a_503_and_a_stuck_render_blocks_no_one(tmp_path):
    store = _store(tmp_path / "lb.db")
    with LeaderboardServer(store, "demo", "127.0.0.1", 0, limits=ServerLimits(max_connections=4)) as server:
        idle = [_connect(server.address, HALF_SENT) for _ in range(4)]
        time.sleep(0.2)
        assert _get(server.url)[0] == 200  # a fifth connection: the oldest idle one made room
        assert _closed_by_server(idle[0], 2) and not _closed_by_server(idle[1], 0.2)
        with _stuck(store):
            busy = []
            for _ in range(4):  # each evicts a half-sent one, then waits on the store
                busy.append(_connect(server.address, b"GET /rows HTTP/1.1\r\nHost: x\r\n\r\n"))
                time.sleep(0.1)
            assert all(_closed_by_server(s, 2) for s in idle[1:])
            extra = _connect(server.address, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            extra.settimeout(2)
            assert extra.recv(100).startswith(b"HTTP/1.1 503 "), "every connection answers: the next one is refused"
            assert _closed_by_server(extra, 2)
        for s in busy:  # the store is free again: the four waiting answers go out
            s.settimeout(10)
            assert s.recv(100).startswith(b"HTTP/1.1 200 ")
        with _stuck(store):  # a render stuck on the store delays only what needs the store
            s = _connect(server.address, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(2)
            assert s.recv(100).startswith(b"HTTP/1.1 404 ")
        for s in idle + busy + [extra, s]:
            s.close()


def test_clients_that_reset_before_their_answer_cost_one_log_line_each_and_no_traceback(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    store = _store(tmp_path / "lb.db")
    with LeaderboardServer(store, "demo", "127.0.0.1", 0) as server:
        with _stuck(store):  # every request waits on the store, so each reset finds its answer pending
            clients = [_connect(server.address, b"GET /api/history HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(50)]
            time.sleep(0.5)
            caplog.clear()
            for c in clients:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
                c.close()
            time.sleep(1.0)
        assert _get(server.url + "api/history")[0] == 200  # and it serves on
    served = [r for r in caplog.records if r.name.startswith(("swarm.leaderboard", "aiohttp", "asyncio"))]
    gone = [r for r in served if "went away" in r.getMessage()]
    print(f"\n{len(served)} log lines for 50 reset clients and one normal one, {len(gone)} of them 'went away'")
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in served), caplog.text
    assert len(gone) == 50 and all("127.0.0.1" in r.getMessage() for r in gone), caplog.text
    assert len(served) <= 51 and not any("\n" in r.getMessage() for r in served), caplog.text


def test_a_client_that_stops_reading_is_cut_at_its_send_deadline(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="swarm.leaderboard")
    store = _store(tmp_path / "lb.db", peers=300, tallies=50)  # /api/history: ~230 KB
    limits = ServerLimits(send_base_s=1.0, min_send_rate=1 << 30, send_buffer=16 * 1024)  # its deadline: ~1 s
    with LeaderboardServer(store, "demo", "127.0.0.1", 0, limits=limits) as server:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes nothing
        s.connect(server.address)
        s.sendall(b"GET /api/history HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(2)  # reads nothing, while the deadline passes
        assert _closed_by_server(s, 5)
        s.close()
    assert [r.getMessage() for r in caplog.records if "cut" in r.getMessage()] == [
        "leaderboard: 127.0.0.1 cut: its answer to /api/history was not out in 1 s"], caplog.text


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 4000, "1,500 sockets on both ends need 4,000 descriptors"


@pytest.mark.integration
def test_1500_half_sent_requests_hold_no_threads_keep_no_one_out_and_are_closed_at_the_deadline(tmp_path):
    _raise_nofile()
    store = _store(tmp_path / "lb.db")
    limits = ServerLimits(request_s=8.0)
    with LeaderboardServer(store, "demo", "127.0.0.1", 0, limits=limits) as server:
        start = time.monotonic()
        idle = [_connect(server.address, HALF_SENT) for _ in range(1500)]
        opened = time.monotonic() - start
        threads, mine = threading.active_count(), _server_threads()
        t = time.monotonic()
        status, _ = _get(server.url)
        answered = time.monotonic() - t
        still = [s for s in idle if not _closed_by_server(s, 0.001)]
        print(f"\n1,500 half-sent requests opened in {opened:.1f} s; a normal GET / answered in {answered:.3f} s; "
              f"{threading.active_count()} threads in this process ({len(mine)} the server's: {mine}); "
              f"{len(still)} of them still open (the cap is {limits.max_connections})")
        assert status == 200 and answered < 5
        assert threads < 50 and len(mine) <= 1 + limits.render_threads
        assert len(still) <= limits.max_connections  # the rest made room for newer ones
        assert opened < limits.request_s - 1, "opening took so long the deadline check below proves little"
        t = time.monotonic()
        late = [s for s in still if not _closed_by_server(s, max(0.1, start + limits.request_s + 5 - time.monotonic()))]
        print(f"the {len(still)} left were closed {time.monotonic() - start:.1f} s after the first was opened")
        assert not late, f"{len(late)} half-sent requests outlived the {limits.request_s} s deadline"
        for s in idle:
            s.close()


@pytest.mark.integration
def test_200_clients_at_once_on_the_history_are_all_answered(tmp_path):
    _raise_nofile()
    store = _store(tmp_path / "lb.db", peers=50, tallies=40)
    with LeaderboardServer(store, "demo", "127.0.0.1", 0) as server:
        url, go, took, codes = server.url + "api/history", threading.Barrier(200), [], []

        def client() -> None:
            go.wait()
            t = time.monotonic()
            codes.append(_get(url, timeout=60)[0])
            took.append(time.monotonic() - t)

        clients = [threading.Thread(target=client) for _ in range(200)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(90)
        took.sort()
        print(f"\n200 clients on /api/history ({len(_get(url)[1]):,} bytes): p50 {statistics.median(took):.3f} s, "
              f"p99 {took[int(0.99 * len(took)) - 1]:.3f} s, max {took[-1]:.3f} s")
        assert codes == [200] * 200
