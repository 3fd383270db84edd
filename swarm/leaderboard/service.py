"""The leaderboard service: the page's server over the store (server.py), and the loop that fills it.

`serve` is the whole service short of its inputs: the caller opens the store and, to collect, a
swarm peer (a `Source`, e.g. a SwarmNode), and closes them after.
Keeping the swarm out of here means the service runs, and is tested, with no DHT at all ("history
only", or a fake source). The collector runs on the caller's thread; the page is served from a
thread and event loop of its own, with the budgets of `ServerLimits`.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

from swarm.leaderboard.server import LeaderboardServer, ServerLimits
from swarm.leaderboard.store import MAX_NAME_LOOKUPS, LeaderboardStore
from swarm.wire.peer import PeerInfo
from swarm.wire.tally import Tally

log = logging.getLogger(__name__)


class Source(Protocol):
    """Where tallies and display names come from (a SwarmNode has all of it)."""

    coordinators: set[str]
    """The peers whose swarm records name the learners (the bootstrap peers it was pointed at)."""

    def trusted_learners(self, coordinators: set[str]) -> dict[str, str]: ...

    def refresh_directory(self, force: bool = False) -> None:
        """Ask the coordinators and the learners for newer records (forced: the poll's own cadence)."""
        ...

    def tally_of(self, learner: str) -> Tally | None: ...

    def peer_records(self, peer_ids: list[str]) -> dict[str, PeerInfo]:
        """peer id -> its own PeerInfo record, one DHT key each (never the whole peers index, which
        any key can grow)."""
        ...


def collect_once(store: LeaderboardStore, tallies: Callable[[], list[Tally]], peers: Callable[[], list[PeerInfo]],
                 trusted: set[str] | None = None) -> dict[str, int]:
    """One pass of the collector: the tallies, then the display names `peers()` gives (called after
    the tallies are in, so it can ask for the names the store wants: `store.name_lookups()`); a name
    is kept only for a peer a tally names, or a learner (`LeaderboardStore.set_name`).
    Returns how many tallies ended how ('new', 'unchanged', 'replay', ...)."""
    outcome: dict[str, int] = {}
    for t in tallies():
        r = store.ingest(t, trusted)
        outcome[r] = outcome.get(r, 0) + 1
    named = store.named()
    for p in peers():
        # a PeerInfo is signed by the peer it names (the DHT's validators check peer_id against
        # the record's owner), so a name is only ever taken for the peer that published it
        if p.name and p.peer_id in named:
            store.set_name(p.peer_id, p.name)
    return outcome


def _collect(store: LeaderboardStore, source: Source, trusted: set[str] | None) -> None:
    """One pass: the tallies of the `trusted` learners, or else of those the coordinators' swarm
    records name, one DHT key each (a tally of a key nobody named is never read, issue 39), and the
    display names of at most `MAX_NAME_LOOKUPS` of the peers they credit and the learners, in turn,
    each at its own key (a name of a key nobody credited is never read)."""
    try:
        # at the leaderboard's --poll, not the directory's own 10 s: a tally read up to 10 s late
        # made the demo wait ~9 s for the final one (the poll is at least 2 s: the directory doors' budgets)
        source.refresh_directory(force=True)
        learners = sorted(trusted if trusted is not None else source.trusted_learners(source.coordinators))
        tallies = lambda: [t for t in map(source.tally_of, learners) if t is not None]  # noqa: E731
        names = lambda: list(source.peer_records(store.name_lookups(MAX_NAME_LOOKUPS)).values())  # noqa: E731
        outcome = collect_once(store, tallies, names, set(learners))
    except Exception as e:  # the DHT is slow or empty: keep serving what we have
        log.warning("could not read tallies from the swarm: %s", e)
        return
    if any(k != "unchanged" for k in outcome):
        log.info("tallies: %s", outcome)


def serve(store: LeaderboardStore, swarm: str, host: str, port: int, stop: threading.Event,
          source: Source | None = None, poll_s: float = 10.0, trusted: set[str] | None = None,
          ready: Callable[[str], None] | None = None, limits: ServerLimits = ServerLimits()) -> None:
    """Serve `store` on host:port until `stop` is set, collecting from `source` every `poll_s` seconds
    (None: serve the stored history only). `ready(url)` is called once the page is reachable.
    The caller keeps ownership of `store` and `source` (closes them). A port in use raises OSError
    before anything starts."""
    with LeaderboardServer(store, swarm, host, port, live=source is not None, limits=limits) as server:
        log.info("leaderboard for swarm %r at %s (%s)", swarm, server.url,
                 "collecting from the swarm" if source is not None else "history only")
        if ready:
            ready(server.url)
        while not stop.is_set():
            if source is not None:
                _collect(store, source, trusted)
            stop.wait(poll_s)
