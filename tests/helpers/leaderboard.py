"""Tallies as a learner signs them, the leaderboard service in a thread, and raw sockets against its
page server, for the leaderboard's tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from pathlib import Path

from swarm.leaderboard import LeaderboardStore, serve
from swarm.wire.peer import PeerInfo


def tally(learner: str, seq: int, peers: dict[str, tuple[int, int]], t: float = 1000.0) -> dict:
    return {"learner": learner, "seq": seq, "time": t, "model_id": "m",
            "peers": {p: {"groups": r // 4, "rollouts": r, "tokens": tok, "first": t - 10.0, "last": t, "models": ["m"]}
                      for p, (r, tok) in peers.items()}}


def peer(peer_id: str, name: str = "") -> PeerInfo:
    """A peer's record as the DHT gives it, with what the leaderboard reads of it: its display name."""
    return PeerInfo(peer_id=peer_id, role="sampler", model_id="m", version=0, engine="hf", throughput=0.0, name=name)


def progress(t: dict, version: int, acc: float | None = None, at: int | None = None) -> dict:
    """`t` as a learner's tally that also says its version and (acc, at) its latest eval."""
    return {**t, "version": version, **({} if acc is None else {"eval_acc": acc, "eval_version": at})}


def http_get(url: str) -> tuple[str, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode(), dict(r.headers)


@contextlib.contextmanager
def served(store: LeaderboardStore, source=None):
    """`serve` in a thread (history only when `source` is None); yields the page's URL."""
    stop, urls = threading.Event(), []
    t = threading.Thread(target=serve, args=(store, "demo", "127.0.0.1", 0, stop),
                         kwargs={"source": source, "poll_s": 0.05, "ready": urls.append}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not urls and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert urls, "the service never became ready"
        yield urls[0]
    finally:
        stop.set()
        t.join(timeout=5)


# ---- the page server's sockets (tests/unit/swarm/test_leaderboard_server.py, and its load test) ----

HALF_SENT = b"GET / HTTP/1.1\r\nHost: x\r\n"  # no blank line: the head never ends


def history_store(path: Path, peers: int = 20, tallies: int = 20) -> LeaderboardStore:
    """A store whose history has peers x tallies points (/api/history grows with both)."""
    store = LeaderboardStore(path)
    for seq in range(1, tallies + 1):
        store.ingest({"learner": "L1", "seq": seq, "time": 1000.0 + seq, "model_id": "m",
                      "peers": {f"P{i:04d}": {"groups": seq, "rollouts": 4 * seq, "tokens": 40 * seq, "first": 999.0,
                                              "last": 1000.0 + seq, "models": ["m"]} for i in range(peers)}})
    return store


def get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    """The status and body of a GET of `url`."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def connect(address: tuple[str, int], send: bytes = b"") -> socket.socket:
    s = socket.create_connection(address, timeout=30)
    if send:
        s.sendall(send)
    return s


def closed_by_server(s: socket.socket, within: float) -> bool:
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
