"""A sampler's side of hetero.tail.v1: the sealed tails it was sent, served to samplers the learner
sent a `TailNotice` instead (swarm/wire/manifest.py). So the learner uploads a version's tail to a
few relays, not to every sampler: at 1,000 samplers, 3.4 MB a version (0.16 copies of a 20 MiB
patch) became ~0.5 MB of notices and 8 tails (docs/BENCHMARKS.md).

A relay can only serve the learner's bytes or none: a notice pins the tail by its sha256, and the
fetcher also opens its seal (swarm/weights/fetcher.py `_relayed_tail`)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from swarm.buckets import worth_logging
from swarm.identity import short_id
from swarm.p2p import SwarmNode
from swarm.p2p.changes import Changes
from swarm.wire.manifest import TAIL, TailRequest, tail_digest

log = logging.getLogger(__name__)


class TailRelay:
    """The last KEEP sealed tails this sampler was sent, by sha256, served to whoever names one."""

    KEEP = 8
    """Tails kept: one a version the learner publishes, and a relay is asked for a tail within a few
    seconds of its publication, so the newest few are all anyone asks for."""
    HOLD_S = 2.0
    """How long a request for a tail not held yet waits for it: the learner sends a version's notices
    the moment it has sent its relays the tail, so a notice's reader may ask before the relay has
    read its own copy. A few round trips on a slow line; past it, b"" (the asker goes on)."""

    def __init__(self, node: SwarmNode, proven: Callable[[str], bool] = lambda peer: False) -> None:
        """`proven`: the askers that draw on a budget of their own (our mates, whom the learner
        credits, as the notices' readers are), not on the pool every other key shares: fresh keys
        that read the relays' ids from notices and empty the pool leave the mates' asks alone."""
        self._tails: collections.OrderedDict[bytes, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()  # kept by the fetcher's thread, served in the node's loop
        self._kept = Changes()
        """Notified when a tail is kept: wakes the requests waiting for one."""
        self.stats: collections.Counter[str] = collections.Counter()
        """tails `served` (of them `served_after_wait`), asked but `not_held`, `malformed` requests,
        calls past the door (`busy`)."""
        self._door = node.doors.open(TAIL, proven=proven)
        node.add_handler(TAIL, self._on_tail)

    def keep(self, sealed: bytes) -> None:
        """Hold a sealed tail the learner sent us, for the samplers its notices send here."""
        with self._lock:
            self._tails[tail_digest(sealed)] = sealed
            while len(self._tails) > self.KEEP:
                self._tails.popitem(last=False)
        self._kept.notify()

    def _held(self, digest: bytes) -> bytes | None:
        with self._lock:
            return self._tails.get(digest)

    async def _wait_for(self, digest: bytes) -> bytes | None:
        """The tail `digest` names, once kept, within HOLD_S."""
        deadline = time.monotonic() + self.HOLD_S
        while (sealed := self._held(digest)) is None:
            if (left := deadline - time.monotonic()) <= 0:
                return None
            await self._kept.wait(left)
        return sealed

    async def _on_tail(self, payload: bytes, remote: str) -> bytes:
        past = self._door.enter(remote)
        if past is not None:  # past its budget: b"" (it asks another relay, or the learner)
            self.stats["busy"] += 1
            await self._door.tarpit(remote, past)
            return b""
        try:
            request = TailRequest.decode(payload)
        except Exception as e:  # msgpack raises several types for garbage
            self.stats["malformed"] += 1
            if worth_logging(self.stats["malformed"]):
                log.info("%s: a malformed request from %s (%s: %s; %d so far)", TAIL, short_id(remote),
                         type(e).__name__, e, self.stats["malformed"])
            await self._door.tarpit(remote)
            return b""
        sealed = self._held(request.digest)
        if sealed is None and (sealed := await self._wait_for(request.digest)) is not None:
            self.stats["served_after_wait"] += 1
        self.stats["served" if sealed else "not_held"] += 1
        return sealed or b""
