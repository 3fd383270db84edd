"""Tallies as a learner signs them, and the leaderboard service in a thread, for the leaderboard's tests."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request

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
