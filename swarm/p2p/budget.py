"""The node-wide budget of inbound streams: no peer, and no crowd of fresh keys, can hold enough
of our file descriptors to stop the process.

Every inbound stream (each call to a streaming or gated handler) costs the process a descriptor
for as long as it is open: p2pd hands it to us over a unix socket. A peer that opens streams and
sends nothing would hold one each until the handler's request timeout; at a 1,024-descriptor limit
1,500 of them made `accept()` fail and the learner exit (issue 39). So before a handler reads a
byte, the stream is counted against

  * its peer's streams on that protocol (`per_peer`): an honest caller keeps a few open (a sampler:
    its gated rollout calls and its parallel chunk streams), so this is small;
  * every inbound stream of the node (`total`), derived from the process's open-file limit, less
    what the node needs for itself (model files, the DHT's sockets, logs, the journal), so that
    however many keys an attacker makes, the descriptors they can hold are bounded;
  * of that, the streams of every key the node does not know (`pool`, half the total), so that the
    peers it knows (a learner's proven samplers: `Doors.set_proven`) always find room;

and a stream past any bound is closed at once (its descriptor lives for microseconds) and
counted by reason. The first request frame must then come within the handler's request timeout,
so a held stream costs its holder a stream slot for seconds, never more.
"""

from __future__ import annotations

import collections
import logging
import resource
from contextlib import contextmanager
from typing import Callable, Iterator

from swarm.buckets import worth_logging

log = logging.getLogger(__package__)

PER_PEER = 16
"""Inbound streams of one peer on one protocol at once: a sampler's fetcher runs 4 parallel chunk
streams to a source and at most 2 rollout calls are past the learner's door at once."""
RESERVED_FDS = 256
"""Descriptors the node keeps for itself whatever arrives: the DHT and p2pd's sockets, model and
checkpoint files, the journal, the outbox, logs."""
MIN_TOTAL = 64


def nofile_limit() -> int:
    """This process's soft limit on open files (RLIMIT_NOFILE)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one (a common soft default is 1,024, which a public
    node's streams can exhaust); returns (before, after). Never fails: a limit it cannot raise stays."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, e)
            return soft, soft
    return soft, nofile_limit()


def total_for(limit: int) -> int:
    """Inbound streams the whole node holds at once under an open-file `limit`: half of what is left
    after `RESERVED_FDS` (the other half stays for outbound calls and sockets p2pd hands us)."""
    return max(MIN_TOTAL, (limit - RESERVED_FDS) // 2)


class StreamBudget:
    """Counts open inbound streams per (peer, protocol), of keys the node does not know (`proven`
    says who it knows), and in all; refuses past any bound. Unknown keys together hold at most half
    of the total, so however many fresh keys an attacker makes, the peers the node knows (a
    learner's proven samplers) always find streams free."""

    def __init__(self, per_peer: int = PER_PEER, total: int | None = None,
                 proven: Callable[[str], bool] = lambda peer: False) -> None:
        self.per_peer = per_peer
        self.total = total_for(nofile_limit()) if total is None else total
        self.pool = max(1, self.total // 2)
        """Streams all unknown keys together may hold."""
        self._proven = proven
        self._open: collections.Counter[tuple[str, str]] = collections.Counter()
        self._all = 0
        self._pooled = 0
        self.refused: collections.Counter[str] = collections.Counter()
        """Streams closed unread, by the bound they met: "peer", "pool" or "total"."""

    @property
    def open(self) -> int:
        return self._all

    def _refusal(self, peer: str, protocol: str, pooled: bool) -> str | None:
        if self._open[peer, protocol] >= self.per_peer:
            return "peer"
        if pooled and self._pooled >= self.pool:
            return "pool"
        if self._all >= self.total:
            return "total"
        return None

    @contextmanager
    def hold(self, peer: str, protocol: str) -> Iterator[bool]:
        """Within it, the stream is counted; yields whether it may be served (False: close it now)."""
        pooled = not self._proven(peer)
        why = self._refusal(peer, protocol, pooled)
        if why is not None:
            self.refused[why] += 1
            if worth_logging(self.refused[why]):
                log.warning("%s: refused a stream of %s past the %s bound (%d refused so far)", protocol,
                            peer[-8:], why, self.refused[why])
            yield False
            return
        self._open[peer, protocol] += 1
        self._all += 1
        self._pooled += pooled
        try:
            yield True
        finally:
            self._all -= 1
            self._pooled -= pooled
            self._open[peer, protocol] -= 1
            if self._open[peer, protocol] <= 0:
                del self._open[peer, protocol]
