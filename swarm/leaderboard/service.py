"""The leaderboard service: a read-only HTTP server over the store, and the loop that fills it.

`serve` is the whole service short of its inputs: the caller opens the store and, to collect, a
swarm peer (anything with `.tallies()` and `.peers()`, e.g. a SwarmNode), and closes them after.
Keeping the swarm out of here means the service runs, and is tested, with no DHT at all ("history
only", or a fake source).

Stdlib HTTP is enough: a handful of small GETs every few seconds per open page, no writes.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Protocol
from urllib.parse import urlparse

from .page import CONTENT_SECURITY_POLICY, render_chart, render_learning_chart, render_page, render_rows
from .store import LeaderboardStore

log = logging.getLogger(__name__)


class Source(Protocol):
    """Where tallies and display names come from (a SwarmNode has both)."""

    def tallies(self) -> list[dict]: ...

    def peers(self) -> list[dict]: ...


def _routes(store: LeaderboardStore, swarm: str, refresh_s: float,
            live: bool) -> dict[str, tuple[str, Callable[[], str]]]:
    """path -> (content type, body); each body reads the store afresh."""

    def chart() -> str:
        names = {p["peer_id"]: p["name"] for p in store.board()["peers"]}
        return render_chart(store.history(), names)

    page = ("text/html; charset=utf-8", lambda: render_page(store.board(), swarm, refresh_s, live))
    return {
        "/": page,
        "/index.html": page,
        "/rows": ("text/html; charset=utf-8", lambda: render_rows(store.board())),
        "/api/leaderboard": ("application/json",
                             lambda: json.dumps({"swarm": swarm, **store.board(), "tallies": store.counters()})),
        "/api/history": ("application/json", lambda: json.dumps(store.history())),
        "/api/learners": ("application/json", lambda: json.dumps(store.learners())),
        "/chart.svg": ("image/svg+xml", chart),
        "/learning.svg": ("image/svg+xml", lambda: render_learning_chart(store.learners())),
    }


def make_server(store: LeaderboardStore, swarm: str, host: str, port: int, refresh_s: float = 5.0,
                live: bool = True) -> ThreadingHTTPServer:
    """An HTTP server (bound, not yet serving) for `store`; port 0 picks a free one (`server.server_address`).
    `live`: the store is being filled from a swarm (the page refreshes; else it says it shows stored
    history). A port in use raises the socket's OSError here."""
    routes = _routes(store, swarm, refresh_s, live)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = urlparse(self.path).path
            route = routes.get(path)
            if route is None:
                self._send(404, "text/plain; charset=utf-8", "not found")
                return
            try:
                body = route[1]()
            except Exception as e:  # one bad request must not take the service down
                log.exception("leaderboard request %s failed", path)
                self._send(500, "text/plain; charset=utf-8", f"internal error: {type(e).__name__}")
                return
            self._send(200, route[0], body)

        def _send(self, code: int, ctype: str, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            self.send_header("X-Content-Type-Options", "nosniff")  # the JSON is never taken for HTML
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("http: " + fmt, *args)

    return ThreadingHTTPServer((host, port), Handler)


def collect_once(store: LeaderboardStore, tallies: Callable[[], list[dict]], peers: Callable[[], list[dict]],
                 trusted: set[str] | None = None) -> dict[str, int]:
    """One pass of the collector: every tally and every display name the DHT holds now.
    Returns how many tallies ended how ('new', 'unchanged', 'replay', ...)."""
    outcome: dict[str, int] = {}
    for t in tallies():
        r = store.ingest(t, trusted)
        outcome[r] = outcome.get(r, 0) + 1
    for p in peers():
        # a PeerInfo is signed by the peer it names (the DHT's validators check peer_id against
        # the record's owner), so a name is only ever taken for the peer that published it
        if p.get("name"):
            store.set_name(p["peer_id"], p["name"])
    return outcome


def _collect(store: LeaderboardStore, source: Source, trusted: set[str] | None) -> None:
    try:
        outcome = collect_once(store, source.tallies, source.peers, trusted)
    except Exception as e:  # the DHT is slow or empty: keep serving what we have
        log.warning("could not read tallies from the swarm: %s", e)
        return
    if any(k != "unchanged" for k in outcome):
        log.info("tallies: %s", outcome)


def serve(store: LeaderboardStore, swarm: str, host: str, port: int, stop: threading.Event,
          source: Source | None = None, poll_s: float = 10.0, trusted: set[str] | None = None,
          ready: Callable[[str], None] | None = None) -> None:
    """Serve `store` on host:port until `stop` is set, collecting from `source` every `poll_s` seconds
    (None: serve the stored history only). `ready(url)` is called once the page is reachable.
    The caller keeps ownership of `store` and `source` (closes them). A port in use raises OSError
    before anything starts."""
    server = make_server(store, swarm, host, port, live=source is not None)
    thread = threading.Thread(target=server.serve_forever, name="leaderboard-http", daemon=True)
    thread.start()
    try:
        url = f"http://{server.server_address[0]}:{server.server_address[1]}/"
        log.info("leaderboard for swarm %r at %s (%s)", swarm, url,
                 "collecting from the swarm" if source is not None else "history only")
        if ready:
            ready(url)
        while not stop.is_set():
            if source is not None:
                _collect(store, source, trusted)
            stop.wait(poll_s)
    finally:
        server.shutdown()  # waits for serve_forever to return
        server.server_close()  # and frees the port for a restart
        thread.join(timeout=5)
