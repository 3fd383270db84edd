"""How long a sampler waits on a source of weights before it goes to the next one (`FetchConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.p2p import Stall
from swarm.wire.chunks import CHUNK_SIZE, MAX_REQUEST_WAIT


@dataclass(frozen=True)
class FetchConfig:
    """How long a sampler waits on a source of chunks before it goes to the next one.

    The defaults are far from what an honest source needs over the emulated WAN (100 Mbit/s, 80 ms:
    a 1 MiB chunk in ~0.1 s alone, ~0.4 s with 4 streams sharing the link, ~1.3 s with 16) and
    close enough that a holder that stalls or trickles costs a version or two, once."""

    idle_s: float = 10.0
    """A stream whose next item header does not come within this (plus the request's own `wait`
    for a mate's download) is abandoned: a peer that accepted and says nothing."""
    min_rate: float = 128 * 1024
    """Bytes/s an item from a holder or mate must average once `idle_s` of slack is spent (a 1 MiB
    chunk: 10 + 8 s), so a frame header claiming 1 MiB followed by a byte a second is abandoned
    mid-frame (and its chunks asked elsewhere)."""
    learner_min_rate: float = 10e6 / 8 / 128
    """The same for the learner's streams: the slowest uplink a learner is expected on (10 Mbit/s)
    shared by 128 streams at once, ~9.8 KB/s. The learner is every chunk's last source: abandoning
    its stream only asks it again, so its bound is against a learner that died mid-stream, not one
    whose uplink the swarm shares (at 25 Mbit/s, 128 KiB/s abandoned the learner's streams by the
    dozen and failed whole versions: examples/bench_wan.py, docs/BENCHMARKS.md)."""
    hedge_s: float = 3.0
    """A stream that delivered no chunk for this long (before its first: plus its `wait`), or for
    `Gather.HEDGE_PACE` times the mean gap between two chunks of a stream of the download's other
    sources if that is longer (at most `idle_s`), has its remaining chunks asked of the next source
    too, the first verified copy winning. Its source is
    demoted only if the stream delivered nothing at all: one that delivered and then paused is
    congested (its stall bound, `idle_s` and `min_rate`, still ends a stream that stops).
    The learner, the last resort, is never hedged against itself."""
    holder_tries: int = 2
    """Holders asked for one chunk before the chunk's owner, and other mates after it, before the
    learner: were they all silent, the learner is reached within (2 * holder_tries + 1) hedges,
    however many holders and mates there are."""
    demote_s: float = 30.0
    """How long a demoted peer (silent, stalled, trickled, lied, announced a version it did not
    serve) is not asked; each further strike doubles it, up to `demote_max_s`."""
    demote_max_s: float = 600.0
    forget_s: float = 3600.0
    """A peer with no strike for this long starts again from `demote_s`."""
    long_poll_s: float = 10.0
    """The learner holds a sampler's request for its manifest this long at most, answering the
    moment it publishes (`WeightServer`): a version is fetched when it exists, not at the next
    poll. 0: poll (once a second) and fetch what is there."""

    def __post_init__(self) -> None:
        if min(self.idle_s, self.min_rate, self.learner_min_rate, self.hedge_s, self.demote_s) <= 0 or self.holder_tries < 0 \
                or not 0 <= self.long_poll_s <= MAX_REQUEST_WAIT:
            raise ValueError(f"FetchConfig: timeouts, rate and demotion must be > 0, holder_tries >= 0, "
                             f"0 <= long_poll_s <= {MAX_REQUEST_WAIT:g}: {self}")
        if self.demote_max_s < self.demote_s:
            raise ValueError(f"FetchConfig: demote_max_s ({self.demote_max_s}) must be >= demote_s ({self.demote_s})")

    def stall(self, wait: float, learner: bool = False) -> Stall:
        """The bound on each item of a chunk stream from a source that may hold it `wait` s."""
        if learner:  # behind other streams' chunks on the same connection: one chunk at its floor rate
            return Stall(self.idle_s + wait + CHUNK_SIZE / self.learner_min_rate, self.learner_min_rate)
        return Stall(self.idle_s + wait, self.min_rate)
