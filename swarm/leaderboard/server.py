"""The leaderboard's public page: an aiohttp server with a budget on every connection.

The page is made for the internet (`--serve 0.0.0.0:PORT`), so what any client does costs the
process a bounded amount (issue 39). The stdlib ThreadingHTTPServer this replaces made one thread
per connection and kept a half-sent request forever (1,500 of them: 1,505 threads), let a burst
wait up to 27.8 s behind its 5-deep accept queue, and logged a 1.2 KB traceback per client that
hung up. Here, with the bounds in `ServerLimits`:

  * one event loop on one thread serves every connection; bodies (SQLite reads) are rendered on a
    small thread pool, each route at most once per `reuse_s` however many ask, so a slow render
    delays only the requests waiting for that body, never the loop;
  * at most `max_connections` are open; past it a new connection takes the place of the one that
    has waited longest for a request, or, when every one is answering, gets a 503 and is closed;
  * a connection must send a whole request head within `request_s` of opening, and the next one
    within `idle_s` of its previous answer, or it is closed;
  * an answer must be taken within `send_s(its size)`, or the connection is cut, and the kernel
    holds at most `send_buffer` of it for a client that stops reading;
  * a client that goes away costs one log line, never a traceback.

Not defended here: a flood of new connections faster than honest clients send their requests (it
evicts them too); that is a job for the network in front (a firewall's per-address rate limit).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from swarm.leaderboard.page import CONTENT_SECURITY_POLICY, render_chart, render_learning_chart, render_page, render_rows
from swarm.leaderboard.store import LeaderboardStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What one client, and all of them together, may hold of the page's server."""

    max_connections: int = 512
    """Open connections at once (fewer if the open-file limit is low: `connection_cap`). A browser
    opens about 6, so this is some 80 open pages at once, and half of the common 1,024 limit."""
    request_s: float = 10.0
    """From connect to a whole request head. A browser sends its few hundred bytes at once; 10 s
    allows a retransmit or two on a bad link, and a half-sent request then holds a slot 10 s at most."""
    idle_s: float = 15.0
    """A kept-alive connection closes when its next request head is not in within this. An open
    page asks every 5 s (`refresh_s`), so it keeps its connection; a closed tab frees it."""
    send_base_s: float = 10.0
    min_send_rate: int = 16 * 1024
    """An answer of n bytes must be out within send_base_s + n / min_send_rate (bytes/s: a poor
    mobile link), else the connection is cut: a client that stops reading holds no slot for long,
    however large the history grows."""
    send_buffer: int = 128 * 1024
    """The kernel's send buffer per connection (SO_SNDBUF; Linux doubles it): what a client that stops
    reading makes us hold past the deadline, until the idle close. Autotuning would let it grow to
    4 MB each; 256 KB in flight still moves 1.3 MB/s at a 200 ms round trip."""
    reuse_s: float = 1.0
    """A route's body is rendered at most once per reuse_s, however many ask (those asking during a
    render wait for it): 512 connections asking for the history cost one render a second, not 512.
    The page refreshes every 5 s and the collector reads the swarm every 10 s: a second is not seen."""
    render_threads: int = 4
    """Bodies read SQLite under the store's one lock, so more threads would only queue on it; a few
    let one route's JSON or SVG be built while another's query runs."""
    backlog: int = 512
    """Connections the kernel completes before we accept them. The stdlib server's 5 overflowed in
    a burst of 200 clients, whose dropped SYNs then waited on TCP's retransmit timer (27.8 s)."""
    shutdown_s: float = 2.0
    """How long closing lets answers in flight finish before they are cut."""

    def send_s(self, n: int) -> float:
        return self.send_base_s + n / self.min_send_rate


RESERVED_FDS = 128
"""Descriptors kept for the process's own use: the store, logs, the swarm peer's sockets and pipes."""


def connection_cap(limits: ServerLimits) -> int:
    """`max_connections`, or fewer under a low open-file limit: past it `accept()` fails (EMFILE)
    and asyncio logs a traceback for every try."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    return max(1, min(limits.max_connections, soft - RESERVED_FDS))


_TEXT = "text/plain; charset=utf-8"
_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",  # the JSON is never taken for HTML
    "Server": "hetero-node",  # not aiohttp's name and version
}
_FULL = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 5\r\nConnection: close\r\n\r\n"


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


class _OneLine(logging.LoggerAdapter):
    """For aiohttp's server logger: it logs a malformed request with its traceback
    (`logger.exception`), which from the internet is routine. One line at INFO, the error named."""

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        self.info(msg, *args, exc_info=exc_info, **kwargs)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        exc = kwargs.pop("exc_info", None)
        exc = sys.exc_info()[1] if exc is True else exc[1] if isinstance(exc, tuple) else exc
        # one line, short, and no '%' from the client's bytes for logging to take as a placeholder
        said = " (" + " ".join(repr(exc).split())[:200].replace("%", "%%") + ")" if exc else ""
        return f"leaderboard http: {msg}{said}", kwargs


class _Door(web.Server):
    """aiohttp's low-level server, counting its connections: the cap, eviction past it, and the
    deadline for a first request (aiohttp's keep-alive timer covers the requests after it)."""

    def __init__(self, handler: Any, limits: ServerLimits, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._limits, self._cap = limits, connection_cap(limits)
        self._live: dict[RequestHandler, None] = {}  # open and not dropped, oldest first
        self._asked: set[RequestHandler] = set()  # sent a whole request at least once
        self._busy: set[RequestHandler] = set()  # answering one now

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        if len(self._live) >= self._cap and not self._evict():
            log.debug("leaderboard: %s refused: %d connections, all answering", peer, self._cap)
            transport.write(_FULL)  # aiohttp never hears of it: its connection_lost ignores it
            transport.close()
            return
        # drain() then waits until an answer is wholly in the kernel, so the send deadline covers
        # all of it and a close after it has nothing to flush (a close that must flush to a client
        # that never reads would hold the descriptor for good)
        transport.set_write_buffer_limits(high=0)
        super().connection_made(handler, transport)
        self._live[handler] = None
        self._loop.call_later(self._limits.request_s, self._deadline, handler, peer)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self._live.pop(handler, None)
        self._asked.discard(handler)
        self._busy.discard(handler)

    @contextmanager
    def answering(self, handler: RequestHandler) -> Iterator[None]:
        self._asked.add(handler)
        self._busy.add(handler)
        try:
            yield
        finally:
            self._busy.discard(handler)

    def _evict(self) -> bool:
        """Close the oldest connection waiting for a request (a half-sent one, or kept alive between
        an open page's refreshes: its browser reconnects); False if every connection is answering."""
        for handler in self._live:
            if handler not in self._busy:
                self._drop(handler, "evicted to make room")
                return True
        return False

    def _deadline(self, handler: RequestHandler, peer: Any) -> None:
        if handler in self._live and handler not in self._asked:
            self._drop(handler, f"no request in {self._limits.request_s:g} s", peer)

    def _drop(self, handler: RequestHandler, why: str, peer: Any = None) -> None:
        del self._live[handler]
        log.debug("leaderboard: connection %s closed: %s", peer or "", why)
        handler.force_close()


def _reset(transport: asyncio.BaseTransport | None) -> None:
    """Cut a connection now, unsent bytes and all (a close would wait on a client that does not read)."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
    transport.abort()


def listen_socket(host: str, port: int, backlog: int | None = None) -> socket.socket:
    """A listening TCP socket on host:port: IPv6 for an IPv6 address (::1, ::), else IPv4 (a name
    such as localhost resolves to its IPv4 address). Raises OSError (socket.gaierror for a name
    that does not resolve)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class LeaderboardServer:
    """The page's server over `store`: bound when made (a port in use raises OSError there; port 0
    picks a free one, see `address`), serving from `start()` until `close()` on a thread of its own
    with its own event loop. `live`: the store is being filled from a swarm (the page refreshes;
    else it says it shows stored history). Use it as a context manager to start and close it."""

    def __init__(self, store: LeaderboardStore, swarm: str, host: str, port: int, refresh_s: float = 5.0,
                 live: bool = True, limits: ServerLimits = ServerLimits()) -> None:
        self.limits = limits
        self._routes = _routes(store, swarm, refresh_s, live)
        self._sock = listen_socket(host, port, limits.backlog)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.send_buffer)  # accepted ones inherit it
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._pool = ThreadPoolExecutor(limits.render_threads, thread_name_prefix="leaderboard-render")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="leaderboard-http", daemon=True)
        self._runner: web.ServerRunner | None = None
        self._door: _Door | None = None
        self._renders: dict[str, tuple[float, asyncio.Future[str]]] = {}  # path -> (started, body); the loop's
        self._closing = False

    @property
    def url(self) -> str:
        host = self.address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.address[1]}/"

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(timeout=30)

    def close(self) -> None:
        """Stop serving and free the port: answers in flight get `shutdown_s` to finish."""
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(timeout=self.limits.shutdown_s + 10)
            except Exception as e:  # noqa: BLE001 (closing goes on whatever went wrong)
                log.warning("leaderboard server did not close cleanly: %s", e)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()
        self._pool.shutdown(wait=True, cancel_futures=True)  # the caller closes the store next
        self._sock.close()

    def __enter__(self) -> LeaderboardServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def _open(self) -> None:
        self._door = _Door(self._handle, self.limits, handler_cancellation=True, keepalive_timeout=self.limits.idle_s,
                           access_log=None, logger=_OneLine(log, {}))
        self._runner = web.ServerRunner(self._door, shutdown_timeout=self.limits.shutdown_s)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock, backlog=self.limits.backlog).start()

    async def _shut(self) -> None:
        """Graceful (aiohttp lets answers finish), then forced (whatever task is left is cancelled)."""
        self._closing = True
        if self._runner is not None:
            await self._runner.cleanup()
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in left:
            t.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self._door is not None
        path = urlparse(request.raw_path).path
        with self._door.answering(request.protocol):
            try:
                code, ctype, body = await self._answer(request.method, path)
                return await self._send(request, path, code, ctype, body.encode())
            except asyncio.CancelledError:  # the client hung up (handler_cancellation), or we close
                if not self._closing:
                    log.info("leaderboard: %s went away before its answer to %.200s", request.remote, path)
                raise

    async def _answer(self, method: str, path: str) -> tuple[int, str, str]:
        if method != "GET":
            return 501, _TEXT, f"unsupported method ({method!r:.20})"
        route = self._routes.get(path)
        if route is None:
            return 404, _TEXT, "not found"
        try:
            body = await self._render(path, route[1])
        except Exception as e:  # one bad request must not take the service down
            log.exception("leaderboard request %s failed", path)
            return 500, _TEXT, f"internal error: {type(e).__name__}"
        return 200, route[0], body

    async def _render(self, path: str, body: Callable[[], str]) -> str:
        """`body()` on the render pool, shared by everyone asking for `path` within `reuse_s` of its start."""
        loop = asyncio.get_running_loop()
        started, render = self._renders.get(path, (0.0, None))
        failed = render is not None and render.done() and (render.cancelled() or render.exception() is not None)
        if render is None or failed or (render.done() and loop.time() - started > self.limits.reuse_s):
            render = loop.run_in_executor(self._pool, body)
            self._renders[path] = (loop.time(), render)
        return await asyncio.shield(render)  # a client that leaves does not cancel the others' render

    async def _send(self, request: web.BaseRequest, path: str, code: int, ctype: str,
                    data: bytes) -> web.StreamResponse:
        response = web.Response(status=code, body=data, headers={**_HEADERS, "Content-Type": ctype})
        deadline = self.limits.send_s(len(data))
        try:
            await asyncio.wait_for(self._write(request, response), deadline)
        except ConnectionError as e:
            log.info("leaderboard: %s went away before its answer to %.200s (%s)", request.remote, path,
                     type(e).__name__)
        except asyncio.TimeoutError:
            log.info("leaderboard: %s cut: its answer to %.200s was not out in %.0f s", request.remote, path, deadline)
            _reset(request.transport)
        else:
            log.debug("leaderboard: %s %s %.200s -> %d", request.remote, request.method, path, code)
        return response  # already sent: aiohttp's own prepare() and write_eof() do nothing more

    @staticmethod
    async def _write(request: web.BaseRequest, response: web.Response) -> None:
        await response.prepare(request)
        await response.write_eof()
