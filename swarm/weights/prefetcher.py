"""Fetching weights in a thread of its own while the sampler generates (`WeightPrefetcher`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from swarm.exchange import WeightVersion
from swarm.weights.fetcher import WeightFetcher

log = logging.getLogger(__name__)


class VersionPace:
    """Seconds between a learner's versions as a sampler sees them arrive: a running mean over the
    polls that brought newer versions of the same chain (`seconds`; 0 until two were seen)."""

    def __init__(self, keep: float = 0.8, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep, self._clock = keep, clock
        self.seconds = 0.0
        self._seen: tuple[float, str, int] | None = None

    def saw(self, chain: str, version: int) -> None:
        now = self._clock()
        if self._seen is not None and self._seen[1] == chain and version > self._seen[2]:
            x = (now - self._seen[0]) / (version - self._seen[2])
            self.seconds = x if not self.seconds else self.keep * self.seconds + (1 - self.keep) * x
        if self._seen is None or self._seen[1] != chain or version > self._seen[2]:
            self._seen = (now, chain, version)


class WeightPrefetcher:
    """Fetches versions in a thread of its own, once every `interval` s, while the sampler generates.

    A sampler that fetched between batches would stall generation for the whole download (seconds
    for a patch over a home link) and, starting at its own moment, would not be downloading when its
    mates ask it for the chunks it owns: they would take those from the learner. Polling apart from
    generation keeps the mates in step (`ChunkStore` waits briefly for a version a mate is about to
    fetch) and the sampler only applies what has already arrived (`take`).
    """

    def __init__(self, fetcher: WeightFetcher, interval: float = 1.0) -> None:
        self.fetcher = fetcher
        self.interval = interval
        """The least time between two polls; each is a long poll (`FetchConfig.long_poll_s`)."""
        self._lock = threading.Lock()
        self._pending: list[WeightVersion] = []
        self._have = ("", -1)
        """(chain, version) the pending list leads to: what the next poll fetches from."""
        self.pace = VersionPace()
        """How often the learner publishes, as seen here: how often its backlog can fall, which
        paused samplers poll it at (rollouts/sender.py)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weight-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self._poll()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def _poll(self) -> None:
        with self._lock:
            have = self._have
        try:  # failures are counted there and retried here
            versions = self.fetcher.fetch(*have, wait=self.fetcher.cfg.long_poll_s, stop=self._stop)
        except Exception:  # a bug must not end the thread: the sampler would never update again
            log.exception("weight prefetch failed")
            return
        if not versions:
            return
        self.pace.saw(versions[-1].chain, versions[-1].version)
        with self._lock:
            if self._have != have:  # `take` restarted us meanwhile: these lead from a stale base
                return
            self._pending += versions
            keyframes = [i for i, wv in enumerate(self._pending) if wv.base is None]
            if keyframes:  # nothing before the last keyframe is needed any more
                self._pending = self._pending[keyframes[-1]:]
            self._have = (versions[-1].chain, versions[-1].version)

    def take(self, have_chain: str, have_version: int) -> list[WeightVersion] | None:
        """The versions fetched so far that lead from `have_version` of `have_chain` (or from a
        keyframe) to the newest; None if there are none. If the sampler holds something they do not
        lead from (it refused a version, or started over), the next poll fetches from what it holds."""
        with self._lock:
            pending, self._pending = self._pending, []
            starts = [i for i, wv in enumerate(pending)
                      if wv.base is None or (wv.chain == have_chain and wv.base == have_version)]
            if not starts:
                if (have_chain, have_version) != self._have:
                    self._have = (have_chain, have_version)
                return None
            return pending[starts[-1]:]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.fetcher.rpc_timeout + 5)
        self.fetcher.close()
